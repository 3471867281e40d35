"""The compute-matching table of beam search vs Best-of-N, on hand-made curves."""

import json

import pytest

from experiments.benchmarks import results
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


def test_no_match_against_a_best_of_n_that_gets_worse_with_n():
  # A verifier that anti-selects: Best-of-N accuracy falls as N grows, so
  # "the tokens Best-of-N needs for 0.3" is not defined (two crossings).
  falling = _curve([(1, 50.0, 0.35), (4, 200.0, 0.30), (16, 800.0, 0.20)])
  assert reports.tokens_to_match(falling, 0.3) is None
  assert reports.tokens_to_match(falling, 0.25) is None


def test_published_table_renders_each_verifier_from_its_curves(tmp_path):
  path = str(tmp_path / "search.json")
  settings = {"num_problems": 4, "candidates": 3}
  start = results.started()
  results.add_search_run(path, "learned", {
      "best_of_n": BEST_OF_N, "prm": _curve([(1, 100.0, 0.6),
                                             (2, 150.0, 0.95)])},
      settings, start)
  results.add_search_run(path, "anti", {
      "best_of_n": _curve([(1, 50.0, 0.4), (4, 200.0, 0.3)]),
      "pav": _curve([(1, 90.0, 0.35)])}, settings, start)
  # Re-adding a verifier replaces its curves.
  results.add_search_run(path, "learned", {
      "best_of_n": BEST_OF_N, "prm": _curve([(1, 100.0, 0.6),
                                             (2, 160.0, 0.95)])},
      settings, start)
  with open(path) as f:
    data = json.load(f)
  assert [r["name"] for r in data["runs"]] == ["anti", "learned"]
  assert data["beam_widths"] == [1, 2]
  beam, best_of_n = results.render("search", data)[:2]
  rows = beam.splitlines()
  # BoN needs 200 tokens for 0.6; beam search spent 100: 2.00x. 0.95 is
  # beyond Best-of-N's reach: no ratio.
  assert ("| learned | beam search on its step scores: accuracy (tokens) "
          "| 0.60 (100) | 0.95 (160) |") in rows
  assert ("| learned | beam search on its step scores: efficiency vs "
          "Best-of-N | 2.00× | – |") in rows
  # Against a falling Best-of-N curve there is no ratio either.
  assert ("| anti | beam search on Q + α·A^μ (PAV): efficiency vs Best-of-N "
          "| – | – |") in rows
  assert "| anti | its scores (min) | 0.40 (50) | 0.30 (200) | – |" in (
      best_of_n)
  with pytest.raises(ValueError, match="other settings"):
    results.add_search_run(path, "x", {}, {"num_problems": 5}, start)
