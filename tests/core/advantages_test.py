"""Tests for rl_rewards.core.advantages (group baselines, REINFORCE++)."""

import jax
import numpy as np
import pytest

from rl_rewards.core import advantages
from . import core_reference

_JIT_GROUP = jax.jit(advantages.group_advantages,
                     static_argnames=("group_size", "estimator", "std_ddof"))
_JIT_PROCESS = jax.jit(advantages.grpo_process_advantages,
                       static_argnames="group_size")


@pytest.mark.parametrize("fn", [advantages.group_advantages, _JIT_GROUP])
def test_tv3_one_group(fn):
  r = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  np.testing.assert_allclose(fn(r, group_size=4, estimator="grpo"),
                             [0.866024, -0.866024, -0.866024, 0.866024],
                             atol=1e-6)
  np.testing.assert_allclose(
      fn(r, group_size=4, estimator="grpo", std_ddof=0),
      [0.999998, -0.999998, -0.999998, 0.999998], atol=1e-6)
  np.testing.assert_allclose(fn(r, group_size=4, estimator="drgrpo"),
                             [0.5, -0.5, -0.5, 0.5], atol=1e-6)
  np.testing.assert_allclose(fn(r, group_size=4, estimator="rloo"),
                             [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6)


def test_tv3_three_samples():
  r = np.array([0.2, 0.5, 0.9], np.float32)
  np.testing.assert_allclose(
      _JIT_GROUP(r, group_size=3, estimator="grpo"),
      [-0.949155, -0.094916, 1.044071], atol=1e-6)
  np.testing.assert_allclose(_JIT_GROUP(r, group_size=3, estimator="rloo"),
                             [-0.5, -0.05, 0.55], atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_zero_variance_groups_are_exactly_zero(estimator):
  # 0.1 is not exact in binary: a naive mean leaves rounding noise that
  # (r − μ)/(σ + 1e-6) would blow up.
  r = np.array([0.1, 0.1, 0.1, 1.0, 1.0, 1.0], np.float32)
  out = np.asarray(_JIT_GROUP(r, group_size=3, estimator=estimator))
  np.testing.assert_array_equal(out, 0.0)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_group_of_one_uses_baseline_zero(estimator):
  # verl convention: no peers -> baseline 0 (and σ = 1 for grpo).
  out = _JIT_GROUP(np.array([0.7, -0.2], np.float32), group_size=1,
                   estimator=estimator)
  scale = 1 / (1 + 1e-6) if estimator == "grpo" else 1.0
  np.testing.assert_allclose(out, np.array([0.7, -0.2]) * scale, rtol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("n", [2, 4])
def test_random_matches_reference(estimator, n):
  rng = np.random.default_rng(n)
  scores = rng.integers(0, 3, size=16).astype(np.float32) / 2
  np.testing.assert_allclose(
      _JIT_GROUP(scores, group_size=n, estimator=estimator),
      core_reference.group_advantages_reference(scores, n, estimator),
      rtol=1e-5, atol=1e-5)


def test_permuting_a_group_permutes_advantages():
  scores = np.array([0.3, 0.9, 0.1, 0.4, 1.0, 0.0, 0.5, 0.2], np.float32)
  perm = np.array([2, 0, 3, 1, 5, 7, 4, 6])  # Within each group of 4.
  out = np.asarray(_JIT_GROUP(scores, group_size=4, estimator="grpo"))
  np.testing.assert_allclose(
      _JIT_GROUP(scores[perm], group_size=4, estimator="grpo"), out[perm],
      rtol=1e-6)


def test_group_statistics():
  mean, std = advantages.group_statistics(
      np.array([1.0, 3.0, 2.0, 2.0], np.float32), 2)
  np.testing.assert_allclose(mean, [2, 2, 2, 2])
  np.testing.assert_allclose(std, [np.sqrt(2), np.sqrt(2), 0, 0], rtol=1e-6)
  mean, std = advantages.group_statistics(np.array([5.0], np.float32), 1)
  np.testing.assert_allclose([mean[0], std[0]], [0.0, 1.0])


def test_bad_group_size_raises():
  with pytest.raises(ValueError, match="not divisible by group_size 4"):
    advantages.group_advantages(np.ones(6), 4, estimator="grpo")
  with pytest.raises(ValueError, match="estimator"):
    advantages.group_advantages(np.ones(4), 2, estimator="ppo")
  with pytest.raises(ValueError, match="Python int"):
    advantages.group_advantages(np.ones(4), 2.0, estimator="rloo")


def test_reinforce_plus_plus_tv4():
  rewards = np.array([[-0.01, -0.02, 0.99], [-0.03, -0.01, 0.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0]])
  adv, ret = jax.jit(advantages.reinforce_plus_plus)(rewards, mask)
  np.testing.assert_allclose(ret, [[0.96, 0.97, 0.99], [-0.04, -0.01, 0.0]],
                             atol=1e-6)
  np.testing.assert_allclose(
      adv, [[0.705643, 0.723923, 0.760485], [-1.122447, -1.067604, 0.0]],
      atol=2e-6)


def test_reinforce_plus_plus_baseline_matches_reference():
  batch = core_reference.random_batch(2, batch=6, length=8)
  mask = batch["mask"]
  scores = np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.0], np.float32)
  adv, ret = jax.jit(advantages.reinforce_plus_plus_baseline,
                     static_argnums=2)(scores, mask, 3)
  centred = core_reference.group_advantages_reference(scores, 3, "drgrpo")
  # The reference subtracts the mean even for zero-variance groups, which is
  # already exactly 0 for these binary scores.
  tiled = np.where(mask, centred[:, None], 0)
  expected = core_reference.whiten_reference(tiled, mask)
  np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, adv)


def _process_reference(step_rewards, step_mask, ids, n, eps=1e-6):
  out = np.zeros(ids.shape)
  for start in range(0, len(step_rewards), n):
    group = [step_rewards[i, k] for i in range(start, start + n)
             for k in range(step_rewards.shape[1]) if step_mask[i, k]]
    mean = np.mean(group) if group else 0.0
    std = np.std(group, ddof=1) if len(group) > 1 else 0.0
    for i in range(start, start + n):
      norm = [(step_rewards[i, k] - mean) / (std + eps) if step_mask[i, k]
              else 0.0 for k in range(step_rewards.shape[1])]
      for t in range(ids.shape[1]):
        if ids[i, t] >= 0:
          out[i, t] = sum(norm[ids[i, t]:])
  return out


def test_grpo_process_hand_computed():
  # One group of two samples: steps [1, 0] and [0.5]; mean 0.5, unbiased
  # std 0.5 -> normalised [1, -1] and [0]. Token advantages sum the current
  # and later steps: sample 0 -> step 0: 1 + (-1) = 0, step 1: -1.
  ids = np.array([[0, 0, 1, -1], [0, 0, -1, -1]])
  rewards = np.array([[1.0, 0.0], [0.5, 0.0]], np.float32)
  mask = np.array([[1, 1], [1, 0]])
  np.testing.assert_allclose(_JIT_PROCESS(rewards, mask, ids, group_size=2),
                             [[0, 0, -1, 0], [0, 0, 0, 0]], atol=1e-5)


def test_grpo_process_random_matches_reference():
  batch = core_reference.random_batch(4, batch=6, length=10, num_steps=10)
  ids = batch["ids"]
  step_mask = core_reference.step_mask_reference(ids, 10)
  rewards = np.random.default_rng(0).random((6, 10)).astype(np.float32)
  np.testing.assert_allclose(
      _JIT_PROCESS(rewards, step_mask, ids, group_size=3),
      _process_reference(rewards, step_mask, ids, 3), rtol=1e-4, atol=1e-4)


def test_group_reduce():
  x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0], [2.0, 4.0]], np.float32)
  np.testing.assert_allclose(advantages.group_reduce(x, 2),
                             [[4, 1], [4, 1], [2.5, 4], [2.5, 4]])
  np.testing.assert_allclose(advantages.group_reduce(x[:, 0], 2, "max"),
                             [3, 3, 2, 2])
  np.testing.assert_allclose(advantages.group_reduce(x[:, 0], 4, "min"),
                             [0.5] * 4)
