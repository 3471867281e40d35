"""The compute-matching table of beam search vs Best-of-N, on hand-made curves."""

import pytest

from rl_rewards import reports


def _curve(points):
  return [{"budget": b, "tokens_per_problem": t, "accuracy": a}
          for b, t, a in points]


BEST_OF_N = _curve([(1, 50.0, 0.4), (4, 200.0, 0.6), (16, 800.0, 0.7)])


def test_tokens_to_match_interpolates_log_tokens():
  # Halfway between 0.4 and 0.6 in accuracy -> the geometric mean of tokens.
  assert reports.tokens_to_match(BEST_OF_N, 0.5) == pytest.approx(100.0)
  assert reports.tokens_to_match(BEST_OF_N, 0.6) == pytest.approx(200.0)
  # Outside the Best-of-N range there is no match.
  assert reports.tokens_to_match(BEST_OF_N, 0.9) is None
  assert reports.tokens_to_match(BEST_OF_N, 0.1) is None


def test_table_matches_each_search_against_its_own_best_of_n():
  curves = {
      "best_of_n": BEST_OF_N,
      "pav": _curve([(2, 100.0, 0.6)]),
      "oracle_best_of_n": _curve([(1, 50.0, 0.4), (4, 200.0, 0.9)]),
      "oracle_pav": _curve([(2, 100.0, 0.9)]),
  }
  rows = reports.search_table(curves).splitlines()
  pav = next(r for r in rows if r.startswith("| pav |"))
  oracle = next(r for r in rows if r.startswith("| oracle_pav |"))
  assert "200 (2.00x)" in pav      # BoN needs 200 tokens for 0.6.
  assert "200 (2.00x)" in oracle   # Oracle BoN needs 200 tokens for 0.9.
  assert "| N=4 |" in next(r for r in rows
                           if r.startswith("| oracle_best_of_n | N=4"))
