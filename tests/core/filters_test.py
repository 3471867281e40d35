"""Tests for rl_rewards.core.filters (PROF consistency filtering)."""

import math

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from rl_rewards.core import filters

_JIT_KEEP = jax.jit(filters.prof_keep_mask,
                    static_argnames=("group_size", "num_remove"))
_JIT_SCORES = jax.jit(filters.prof_scores)
_JIT_ADV = jax.jit(filters.kept_group_advantages,
                   static_argnames=("group_size",))


def _keep_reference(scores, correct, group_size, num_remove, valid=None):
  """PROF-GRPO's `filter_trajectories`, loop for loop (Python sort/round)."""
  valid = np.ones(len(scores), bool) if valid is None else valid
  keep = np.zeros(len(scores), bool)
  for start in range(0, len(scores), group_size):
    rows = [i for i in range(start, start + group_size) if valid[i]]
    n_remove = min(num_remove, len(rows))
    pos = [(i, scores[i]) for i in rows if correct[i]]
    neg = [(i, scores[i]) for i in rows if not correct[i]]
    n_pos = min(n_remove, round((len(pos) - len(neg) + n_remove) / 2))
    pos.sort(key=lambda x: x[1])
    neg.sort(key=lambda x: x[1])
    removed = set()
    if n_pos > 0:
      taken = min(n_pos, len(pos))
      removed |= {i for i, _ in pos[:taken]}
      removed |= {i for i, _ in neg[:min(n_remove - taken, len(neg))]}
    else:
      removed |= {i for i, _ in neg[:min(n_remove, len(neg))]}
    for i in rows:
      keep[i] = i not in removed
  return keep


def _scores_reference(p, mask, correct, lo=2, hi=30, lam=10.0):
  p_bar = p[mask].mean()
  out = []
  for i in range(len(p)):
    h = mask[i].sum()
    sign = 2 * float(correct[i]) - 1
    c = np.mean(2 * (p[i][mask[i]] - p_bar) * sign) if h else 0.0
    out.append(c - lam * float(h < lo or h > hi))
  return np.array(out)


def _grpo_reference(scores, keep, n, eps=1e-6):
  """verl's GRPO on the kept rows (torch.std is unbiased)."""
  adv = np.zeros(len(scores))
  for start in range(0, len(scores), n):
    rows = [i for i in range(start, start + n) if keep[i]]
    vals = np.array([scores[i] for i in rows], np.float64)
    if len(rows) == 1:
      mean, std = 0.0, 1.0
    elif len(rows) > 1:
      mean, std = vals.mean(), vals.std(ddof=1)
    for i in rows:
      adv[i] = (scores[i] - mean) / (std + eps)
  return adv


# One group of 8 per case, scores rising with the row index so that "the
# lowest r of a class" is readable: row i has score i.
_ASC = np.arange(8, dtype=np.float32)


@pytest.mark.parametrize("pattern,num_remove,dropped", [
    # 5 correct, 3 wrong, R = 4: r+ = round((2 + 4)/2) = 3, r- = 1.
    # A wrong sign of delta (N- − N+) gives r+ = 1 and fails.
    ("11111000", 4, [0, 1, 2, 5]),
    # 4/4, R = 3: (0 + 3)/2 = 1.5 -> 2 (half to even), r- = 1.
    # Floor rounding gives r+ = 1 and fails.
    ("11110000", 3, [0, 1, 4]),
    # 5/3, R = 3: (2 + 3)/2 = 2.5 -> 2 (half to even), r- = 1.
    # Round-half-up gives r+ = 3, r- = 0 and fails.
    ("11111000", 3, [0, 1, 5]),
    # All correct: the 4 lowest correct rows go.
    ("11111111", 4, [0, 1, 2, 3]),
    # All wrong: (−8 + 4)/2 < 0 -> r+ = 0, the 4 lowest wrong rows go.
    ("00000000", 4, [0, 1, 2, 3]),
    # 1 correct, 7 wrong: (−6 + 4)/2 = −1 -> r+ = 0, r- = 4; the correct
    # row survives even though it has the lowest score.
    ("10000000", 4, [1, 2, 3, 4]),
    # 7 correct: (6 + 4)/2 = 5 capped at R = 4; the wrong row stays.
    ("01111111", 4, [1, 2, 3, 4]),
])
def test_keep_mask_hand_computed(pattern, num_remove, dropped):
  correct = np.array([c == "1" for c in pattern])
  keep = np.asarray(_JIT_KEEP(_ASC, correct, 8, num_remove=num_remove))
  np.testing.assert_array_equal(np.flatnonzero(~keep), dropped)


def test_keep_mask_removes_lowest_not_highest():
  # Scores descending: the lowest correct rows are now 4, 3, 2. Keeping by
  # the wrong end (dropping the highest) fails here.
  correct = np.array([1, 1, 1, 1, 1, 0, 0, 0], bool)
  keep = _JIT_KEEP(_ASC[::-1].copy(), correct, 8, num_remove=4)
  np.testing.assert_array_equal(np.flatnonzero(~np.asarray(keep)),
                                [2, 3, 4, 7])


def test_keep_mask_ties_drop_the_earlier_row():
  scores = np.array([1, 1, 1, 1, 0, 0], np.float32)
  correct = np.array([1, 1, 1, 1, 0, 0], bool)
  # (4 − 2 + 2)/2 = 2 correct rows go: the two earliest of four tied rows.
  keep = _JIT_KEEP(scores, correct, 6, num_remove=2)
  np.testing.assert_array_equal(keep, [0, 0, 1, 1, 1, 1])


def test_keep_mask_matches_reference_with_ties_and_padding():
  rng = np.random.default_rng(0)
  for num_remove, n in ((4, 8), (3, 8), (5, 6), (0, 4), (9, 8)):
    scores = rng.integers(-2, 3, size=12 * n).astype(np.float32)
    correct = rng.random(12 * n) < rng.random(12 * n)
    valid = rng.random(12 * n) > 0.2
    got = np.asarray(_JIT_KEEP(scores, correct, n, num_remove=num_remove,
                               sample_mask=valid))
    np.testing.assert_array_equal(
        got, _keep_reference(scores, correct, n, num_remove, valid),
        err_msg=f"num_remove={num_remove}, n={n}")


def test_keep_mask_padding_rows_change_nothing():
  rng = np.random.default_rng(1)
  scores = rng.normal(size=(5, 8)).astype(np.float32)
  correct = rng.random((5, 8)) < 0.5
  keep = np.asarray(_JIT_KEEP(scores.ravel(), correct.ravel(), 8,
                              num_remove=4)).reshape(5, 8)
  # Two invalid rows with extreme scores in every group (n = 8 -> 10).
  pad_scores = np.concatenate([scores, np.full((5, 2), -99.0)], 1)
  pad_correct = np.concatenate([correct, np.ones((5, 2), bool)], 1)
  valid = np.arange(10)[None, :].repeat(5, 0) < 8
  padded = np.asarray(_JIT_KEEP(pad_scores.ravel(), pad_correct.ravel(), 10,
                                num_remove=4, sample_mask=valid.ravel()))
  padded = padded.reshape(5, 10)
  np.testing.assert_array_equal(padded[:, :8], keep)
  assert not padded[:, 8:].any()


def test_scores_hand_computed():
  # p̄ = (0.9 + 0.7 + 0.2 + 0.6 + 0.4)/5 = 0.56 over all valid steps.
  # Row 0 (correct): mean(2·0.34, 2·0.14) = 0.48.
  # Row 1 (wrong): −mean(2·(−0.36), 2·0.04, 2·(−0.16)) = 0.32.
  # Catches: no sign flip for wrong rows (−0.32), sum instead of mean
  # (0.96), a per-row instead of the batch mean p̄ (0.0 and 0.0), and
  # padded steps leaking in (the 5.0 of row 0).
  p = np.array([[0.9, 0.7, 5.0], [0.2, 0.6, 0.4]], np.float32)
  m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  out = _JIT_SCORES(p, m, np.array([1, 0]))
  np.testing.assert_allclose(out, [0.48, 0.32], atol=1e-6)


def test_scores_length_penalty_and_empty_rows():
  p = np.array([[0.9, 0.0, 0.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]],
               np.float32)
  m = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)
  # p̄ = (0.9 + 1.5)/4 = 0.6. Row 0: one step, 2·0.3 − 10 = −9.4.
  # Row 1: 3 steps, −2·(−0.1) = 0.2 with max_steps = 3 (not > 3), but
  # penalised with max_steps = 2. Row 2: no steps, c = 0, penalised.
  out = _JIT_SCORES(p, m, np.array([1, 0, 1]), max_steps=3)
  np.testing.assert_allclose(out, [-9.4, 0.2, -10.0], atol=1e-5)
  out = _JIT_SCORES(p, m, np.array([1, 0, 1]), max_steps=2)
  np.testing.assert_allclose(out, [-9.4, -9.8, -10.0], atol=1e-5)


def test_scores_match_reference_and_ignore_padding():
  rng = np.random.default_rng(2)
  p = rng.random((16, 7)).astype(np.float32)
  m = np.arange(7)[None, :] < rng.integers(0, 8, 16)[:, None]
  correct = rng.random(16) < 0.5
  out = np.asarray(_JIT_SCORES(p, m, correct, max_steps=5))
  np.testing.assert_allclose(out, _scores_reference(p, m, correct, hi=5),
                             rtol=1e-5, atol=1e-5)
  padded = _JIT_SCORES(np.pad(p, ((0, 0), (0, 3)), constant_values=9.0),
                       np.pad(m, ((0, 0), (0, 3))), correct, max_steps=5)
  np.testing.assert_allclose(padded, out, rtol=1e-6, atol=1e-6)


def test_kept_advantages_hand_computed():
  # Group 1: kept scores 1, 0, 1: μ = 2/3, σ = sqrt((1/9 + 4/9 + 1/9)/2)
  # = sqrt(1/3); A = ±(1/3)/σ, −(2/3)/σ. Statistics over all four rows
  # (μ = 3/4) or a population std fail.
  # Group 2: one kept row: μ = 0, σ = 1 (verl), A = s/(1 + eps).
  # Group 3: kept scores equal: A = 0 exactly.
  scores = np.array([1, 0, 1, 1, 0.5, 1, 1, 0, 1, 1, 0, 0], np.float32)
  keep = np.array([1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0], bool)
  out = np.asarray(_JIT_ADV(scores, keep, 4))
  s = math.sqrt(1 / 3)
  np.testing.assert_allclose(
      out, [1 / 3 / s, -2 / 3 / s, 0, 1 / 3 / s, 0, 1 / (1 + 1e-6), 0, 0,
            0, 0, 0, 0], rtol=1e-5, atol=1e-6)


def test_kept_advantages_match_reference_and_padding():
  rng = np.random.default_rng(3)
  scores = rng.integers(0, 2, 48).astype(np.float32)
  scores[::5] += 0.5
  keep = rng.random(48) < 0.7
  out = np.asarray(_JIT_ADV(scores, keep, 6))
  np.testing.assert_allclose(out, _grpo_reference(scores, keep, 6),
                             rtol=1e-5, atol=1e-6)
  # Dropped rows with junk scores do not move the kept rows' statistics.
  junk = np.where(keep, scores, 1e3).astype(np.float32)
  np.testing.assert_allclose(_JIT_ADV(junk, keep, 6), out, rtol=1e-6)


def test_keep_then_advantage_pipeline():
  # A group of 8 with 6 correct: PROF drops the 4 lowest correct rows
  # (r+ = round((4 + 4)/2) = 4), leaving 2 correct and 2 wrong: GRPO then
  # sees a balanced group: μ = 1/2, σ = sqrt(1/3), A = ±sqrt(3)/2.
  correct = np.array([1, 1, 1, 1, 1, 1, 0, 0], bool)
  keep = _JIT_KEEP(_ASC, correct, 8, num_remove=4)
  np.testing.assert_array_equal(np.flatnonzero(keep), [4, 5, 6, 7])
  adv = _JIT_ADV(correct.astype(np.float32), keep, 8)
  np.testing.assert_allclose(adv, [0, 0, 0, 0] + [math.sqrt(3) / 2] * 2
                             + [-math.sqrt(3) / 2] * 2, rtol=1e-5)


def test_jit_matches_eager():
  rng = np.random.default_rng(4)
  p = rng.random((8, 5)).astype(np.float32)
  m = np.arange(5)[None, :] < rng.integers(0, 6, 8)[:, None]
  correct = rng.random(8) < 0.5
  valid = rng.random(8) < 0.9
  args = (p, m, correct)
  np.testing.assert_allclose(filters.prof_scores(*args), _JIT_SCORES(*args),
                             rtol=1e-6, atol=1e-6)
  scores = np.asarray(_JIT_SCORES(*args))
  keep = filters.prof_keep_mask(scores, correct, 4, num_remove=2,
                                sample_mask=valid)
  np.testing.assert_array_equal(
      keep, _JIT_KEEP(scores, correct, 4, num_remove=2, sample_mask=valid))
  np.testing.assert_allclose(
      filters.kept_group_advantages(correct * 1.0, keep, 4),
      _JIT_ADV(correct * 1.0, keep, 4), rtol=1e-6, atol=1e-6)


def test_rejects_bad_arguments():
  with pytest.raises(ValueError, match="num_remove"):
    filters.prof_keep_mask(_ASC, _ASC > 3, 8, num_remove=-1)
  with pytest.raises(ValueError, match="divisible"):
    filters.prof_keep_mask(_ASC, _ASC > 3, 3, num_remove=1)


def test_degenerate_inputs_give_finite_values():
  # Groups of one, a group with no valid row, rows without steps.
  p = np.zeros((4, 3), np.float32)
  m = np.zeros((4, 3), bool)
  correct = np.array([1, 0, 1, 0], bool)
  scores = np.asarray(_JIT_SCORES(p, m, correct))
  np.testing.assert_allclose(scores, [-10.0] * 4)
  keep = _JIT_KEEP(scores, correct, 1, num_remove=0)
  np.testing.assert_array_equal(keep, [1, 1, 1, 1])
  adv = np.asarray(_JIT_ADV(correct * 1.0, keep, 1))
  np.testing.assert_allclose(adv, [1 / (1 + 1e-6), 0, 1 / (1 + 1e-6), 0])
  none = _JIT_KEEP(scores, correct, 2, num_remove=1,
                   sample_mask=np.zeros(4, bool))
  assert not np.asarray(none).any()
  adv = np.asarray(_JIT_ADV(correct * 1.0, none, 2))
  assert np.all(np.isfinite(adv)) and not adv.any()


def test_shard_map_statistics_are_global():
  # 16 rows on 8 devices, 2 per device: each group of 4 spans two devices
  # and p̄ spans all eight; per-device statistics would differ.
  rng = np.random.default_rng(5)
  p = rng.random((16, 5)).astype(np.float32)
  m = np.arange(5)[None, :] < rng.integers(1, 6, 16)[:, None]
  correct = rng.random(16) < 0.5
  keep = rng.random(16) < 0.7

  def fn(p, m, correct, keep, axis_name):
    return (filters.prof_scores(p, m, correct, axis_name=axis_name),
            filters.kept_group_advantages(correct * 1.0, keep, 4,
                                          axis_name=axis_name))

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  sharded = jax.jit(jax.shard_map(
      lambda *a: fn(*a, axis_name="data"), mesh=mesh, in_specs=P("data"),
      out_specs=P("data")))(p, m, correct, keep)
  single = jax.jit(lambda *a: fn(*a, axis_name=None))(p, m, correct, keep)
  for s, e in zip(sharded, single):
    np.testing.assert_allclose(s, e, rtol=1e-5, atol=1e-6)
