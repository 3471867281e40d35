"""Tests for rl_rewards.core.process (PAV, Clip/Delta, merging)."""

import jax
import numpy as np
import pytest

from rl_rewards.core import process
from rl_rewards.core import returns

_JIT_PROGRESS = jax.jit(process.progress)
_JIT_DELTA = jax.jit(process.delta_step_rewards)
_JIT_MERGE = jax.jit(process.merge_steps_by_label)


@pytest.mark.parametrize("progress_fn", [process.progress, _JIT_PROGRESS])
def test_pav_tv11(progress_fn):
  q_pi = np.array([[0.2, 0.5, 0.4]], np.float32)
  q_mu = process.best_of_k(q_pi, 4)
  np.testing.assert_allclose(q_mu, [[0.5904, 0.9375, 0.8704]], atol=1e-6)
  v_mu = process.best_of_k(np.array([0.25], np.float32), 4)
  np.testing.assert_allclose(v_mu, [0.68359375], atol=1e-7)
  a_mu = progress_fn(q_mu, v_mu, np.ones((1, 3)))
  np.testing.assert_allclose(a_mu, [[-0.093194, 0.3471, -0.0671]], atol=1e-6)
  a_pi = progress_fn(q_pi, np.array([0.25], np.float32), np.ones((1, 3)))
  np.testing.assert_allclose(a_pi, [[-0.05, 0.3, -0.1]], atol=1e-6)
  for alpha, expected in ((0.5, [0.153403, 0.67355, 0.36645]),
                          (3.0, [-0.079581, 1.5413, 0.1987])):
    np.testing.assert_allclose(
        process.effective_step_rewards(q_pi, a_mu, np.ones((1, 3)),
                                       alpha=alpha), [expected], atol=1e-6)


def test_progress_masks_and_single_step():
  q = np.array([[0.6, 0.9, 7.0], [0.3, 5.0, 5.0]], np.float32)
  m = np.array([[1, 1, 0], [1, 0, 0]])
  out = _JIT_PROGRESS(q, np.array([0.5, 0.4], np.float32), m)
  # K = 1 (no delimiter): A = Q(s1, a1) − V(s1).
  np.testing.assert_allclose(out, [[0.1, 0.3, 0], [-0.1, 0, 0]], atol=1e-6)


def test_pav_advantages_use_each_steps_own_progress():
  # Not a sum over future steps: step 0 tokens get 0.5 + 2·(−0.1).
  ids = np.array([[0, 0, 1, 1, -1]])
  out = process.pav_advantages(np.array([0.5], np.float32),
                               np.array([[-0.1, 0.3]], np.float32), ids,
                               (ids >= 0).astype(np.int32), alpha=2.0)
  np.testing.assert_allclose(out, [[0.3, 0.3, 1.1, 1.1, 0.0]], atol=1e-6)


def test_clip_delta_tv12():
  r = np.array([[0.9, 0.6, 0.8]], np.float32)
  m = np.ones((1, 3))
  clipped = process.clip_step_rewards(r, m, eta=0.7)
  np.testing.assert_allclose(clipped, [[0, -0.1, 0]], atol=1e-6)
  delta = _JIT_DELTA(r, m)
  np.testing.assert_allclose(delta, [[0.3, 0.6, 0]], atol=1e-6)
  np.testing.assert_allclose(returns.step_returns(delta, m),
                             [[0.9, 0.6, 0]], atol=1e-6)
  clip_delta = _JIT_DELTA(clipped, m)
  np.testing.assert_allclose(clip_delta, [[0.1, -0.1, 0]], atol=1e-6)
  np.testing.assert_allclose(returns.step_returns(clip_delta, m),
                             [[0, -0.1, 0]], atol=1e-6)


def test_delta_telescopes_for_random_lengths():
  rng = np.random.default_rng(0)
  r = rng.random((5, 6)).astype(np.float32)
  counts = np.array([0, 1, 2, 4, 6])
  m = np.arange(6)[None, :] < counts[:, None]
  ret = np.asarray(returns.step_returns(_JIT_DELTA(r, m), m))
  for b, k_count in enumerate(counts):
    for k in range(6):
      expected = r[b, k] if k < k_count - 1 else 0.0
      np.testing.assert_allclose(ret[b, k], expected, atol=1e-6)


def test_aggregate_step_scores_tv14():
  s = np.array([[0.9, 0.4, 0.8, 5.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
  m = np.array([[1, 1, 1, 0], [0, 0, 0, 0]])
  for method, expected in (("min", 0.4), ("last", 0.8), ("product", 0.288),
                           ("mean", 0.7)):
    out = process.aggregate_step_scores(s, m, method)
    np.testing.assert_allclose(out, [expected, 0.0], atol=1e-6)


def test_merge_steps_by_label():
  ids = np.array([[0, 0, 1, 2, 2, 3, 4, -1], [0, 1, 1, -1, -1, -1, -1, -1]])
  labels = np.array([[1, 1, 0, 0, 1, 7], [0, 0, 1, 1, 1, 1]])
  m = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])
  thought_ids, step_to_thought, thought_labels, thought_mask = _JIT_MERGE(
      ids, labels, m)
  np.testing.assert_array_equal(step_to_thought,
                                [[0, 0, 1, 1, 2, -1], [0, 0, -1, -1, -1, -1]])
  np.testing.assert_array_equal(thought_ids, [[0, 0, 0, 1, 1, 1, 2, -1],
                                              [0, 0, 0, -1, -1, -1, -1, -1]])
  np.testing.assert_array_equal(thought_labels,
                                [[1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(thought_mask, [[1, 1, 1, 0, 0, 0],
                                               [1, 0, 0, 0, 0, 0]])


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="method"):
    process.aggregate_step_scores(np.ones((1, 2)), np.ones((1, 2)), "max")
  with pytest.raises(ValueError, match="initial_value"):
    process.progress(np.ones((2, 3)), np.ones((2, 1)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="k"):
    process.best_of_k(0.5, 0)
