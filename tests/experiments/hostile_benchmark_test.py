"""Adversarial model output through every verifier and the step checker.

The default suite runs a seeded sample of the corpus (every category
included) with a short time limit; the whole corpus runs under the `slow`
mark and in `python -m experiments.benchmarks.hostile`.
"""

import collections

import pytest

from experiments.benchmarks import hostile
from experiments.benchmarks import hostile_corpus
from rl_rewards.tasks import verifiers


def _key(item):
  text = item.text
  return (item.category, item.name, type(text).__name__,
          text if isinstance(text, (str, bytes)) else repr(type(text)))


def test_corpus_is_large_deterministic_and_covers_every_category():
  items = hostile_corpus.corpus(seed=0)
  assert len(items) >= 300
  assert [_key(i) for i in items] == [_key(i) for i in
                                      hostile_corpus.corpus(seed=0)]
  assert [_key(i) for i in items] != [_key(i) for i in
                                      hostile_corpus.corpus(seed=1)]
  counts = collections.Counter(item.category for item in items)
  assert set(counts) == set(hostile_corpus.CATEGORIES)
  assert min(counts.values()) >= 8
  texts = [i.text for i in items if isinstance(i.text, str)]
  assert max(len(t) for t in texts) >= 1 << 20          # megabyte strings
  assert any("9" * 1_000_000 in t for t in texts)       # 10^6 digits
  assert any(t.count(r"\frac{1}{") >= 10_000 for t in texts)
  assert any("\ud800" in t for t in texts)              # lone surrogates
  assert any("\x00" in t for t in texts)


def _check(results, items, timeout_s):
  wrong_types = sum(item.category == "wrong_type" for item in items)
  for name, result in results.items():
    counts = result["counts"]
    assert sum(counts.values()) == len(items), name
    assert counts["wrong_type"] == wrong_types, name
    assert counts["crash"] == 0 and counts["error"] == 0, (name, counts)
    assert result["right_answer_scored"], name
    if name in ("math", "reasoning_gym"):
      # Every call returned within its limit (alarm, or kill at the grace).
      assert result["max_call_s"] <= timeout_s + verifiers.KILL_GRACE_S + 0.5
    else:  # Linear-time, in process, even on megabyte inputs.
      assert result["max_call_s"] < 0.5, name
  for name in ("exact", "gsm8k", "math", "reasoning_gym"):
    # Inputs over the size limit are rejected unread.
    big = sum(isinstance(i.text, str) and len(i.text) > 10_000 for i in items)
    assert results[name]["counts"]["oversize"] >= big, name


def test_seeded_sample_through_every_verifier():
  corpus = hostile_corpus.corpus(seed=0)
  items = hostile_corpus.sample(corpus, 30, seed=0)
  # The right answer, which every verifier must still score 1.
  items += [i for i in corpus if i.name == "bare answer" and i not in items]
  assert {i.category for i in items} == set(hostile_corpus.CATEGORIES)
  # Workers of pools that earlier tests in this process left open (the
  # default pool lives until exit) are not this run's.
  before = set(verifiers.live_worker_pids())
  # One worker: each pool imports its library once (seconds of CPU).
  results = hostile.run(items, timeout_s=1.0, batch_size=16, num_workers=1)
  assert set(results) == set(hostile.VERIFIERS)
  _check(results, items, timeout_s=1.0)
  # The pools are closed: no verifier worker outlives the run.
  assert set(verifiers.live_worker_pids()) <= before
  table = hostile.table(results, len(items))
  assert "| math |" in table and "verifications/s" in table


@pytest.mark.slow
def test_whole_corpus_through_every_verifier():
  items = hostile_corpus.corpus(seed=0)
  results = hostile.run(items, timeout_s=2.0, batch_size=64, num_workers=2)
  _check(results, items, timeout_s=2.0)
  # math-verify meets inputs that make sympy run for ever: they time out.
  assert results["math"]["counts"]["timeout"] >= 10
