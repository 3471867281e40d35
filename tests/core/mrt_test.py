"""Tests for rl_rewards.core.mrt (MRT progress bonus)."""

import jax
import numpy as np
import pytest

from rl_rewards.core import mrt

_JIT_PROGRESS = jax.jit(mrt.mrt_progress, static_argnames=("reference",))
_JIT_ADV = jax.jit(mrt.mrt_advantages, static_argnames=("reference",))

# J(μ | c) = 0.1; after episodes 0, 1, 2: 0.2, 0.5, 0.4. Row 1 has one
# episode and junk values past it.
_VALUES = np.array([[0.2, 0.5, 0.4], [0.9, 7.0, 7.0]], np.float32)
_INITIAL = np.array([0.1, 0.6], np.float32)
_EPISODES = np.array([[1, 1, 1], [1, 0, 0]], bool)


def test_progress_hand_computed():
  # previous: J_j − J_{j−1} = [0.1, 0.3, −0.1]; an off-by-one
  # (J_{j+1} − J_j) gives [0.3, −0.1, ...] and fails.
  np.testing.assert_allclose(_JIT_PROGRESS(_VALUES, _INITIAL, _EPISODES),
                             [[0.1, 0.3, -0.1], [0.3, 0, 0]], atol=1e-6)
  # prompt: J_j − J(μ | c) = [0.1, 0.4, 0.3].
  np.testing.assert_allclose(
      _JIT_PROGRESS(_VALUES, _INITIAL, _EPISODES, reference="prompt"),
      [[0.1, 0.4, 0.3], [0.3, 0, 0]], atol=1e-6)


def test_advantages_hand_computed():
  # A_t = A_out + α·r_prg(episode of t), α = 2, A_out = [0.5, −1]:
  #   row 0: prompt, e0, e0, e1, e2, e2, pad ->
  #          [0, 0.7, 0.7, 1.1, 0.3, 0.3, 0];
  #   row 1: e0 x3 -> −1 + 0.6 = −0.4.
  # A sum over later episodes (a return) would give e0 = 0.5 + 2·0.3 = 1.1
  # and fail; the telescoped sum leaves only J_last − J(μ | c).
  ids = np.array([[-1, 0, 0, 1, 2, 2, -1], [0, 0, 0, -1, -1, -1, -1]])
  out = _JIT_ADV(np.array([0.5, -1.0]), _VALUES, _INITIAL, ids, ids >= 0,
                 alpha=2.0)
  np.testing.assert_allclose(out, [[0, .7, .7, 1.1, .3, .3, 0],
                                   [-.4, -.4, -.4, 0, 0, 0, 0]], atol=1e-6)
  eager = mrt.mrt_advantages(np.array([0.5, -1.0]), _VALUES, _INITIAL, ids,
                             ids >= 0, alpha=2.0)
  np.testing.assert_allclose(eager, out, atol=1e-6)


def test_advantages_padding_invariance():
  rng = np.random.default_rng(0)
  ids = np.sort(rng.integers(0, 4, (5, 9)), axis=1)
  ids[:, :2] = -1
  mask = ids >= 0
  values = rng.random((5, 4)).astype(np.float32)
  initial = rng.random(5).astype(np.float32)
  outcome = rng.normal(size=5).astype(np.float32)
  out = _JIT_ADV(outcome, values, initial, ids, mask, alpha=0.5)
  # Junk ids under a zero mask, extra episode columns with junk values.
  padded = _JIT_ADV(outcome, np.pad(values, ((0, 0), (0, 2)),
                                    constant_values=5.0), initial,
                    np.pad(ids, ((0, 0), (0, 3)), constant_values=5),
                    np.pad(mask, ((0, 0), (0, 3))), alpha=0.5)
  np.testing.assert_allclose(np.asarray(padded)[:, :9], out, atol=1e-6)
  assert not np.asarray(padded)[:, 9:].any()
  # Naive reference.
  for b in range(5):
    for t in range(9):
      k = ids[b, t]
      prev = initial[b] if k == 0 else values[b, k - 1]
      want = outcome[b] + 0.5 * (values[b, k] - prev) if k >= 0 else 0.0
      np.testing.assert_allclose(out[b, t], want, atol=1e-6)


def test_termination_advantages():
  # A = R − J_term: no group mean, no std scaling.
  out = mrt.termination_advantages(np.array([1.0, 0.0, 1.0]),
                                   np.array([0.25, 0.5, 1.0]))
  np.testing.assert_allclose(out, [0.75, -0.5, 0.0])
  with pytest.raises(ValueError, match="termination_values"):
    mrt.termination_advantages(np.ones(3), np.ones(2))


def test_rejects_unknown_reference():
  with pytest.raises(ValueError, match="reference"):
    mrt.mrt_progress(_VALUES, _INITIAL, _EPISODES, reference="next")


def test_row_without_episodes_is_zero():
  ids = np.array([[0, 1], [-1, -1]])
  out = _JIT_ADV(np.array([1.0, 1.0]), np.ones((2, 2), np.float32),
                 np.zeros(2, np.float32), ids, ids >= 0, alpha=1.0)
  np.testing.assert_allclose(out, [[2, 1], [0, 0]])
