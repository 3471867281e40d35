"""Tests for rl_rewards.core.gated_rewards (Posterior-GRPO, Trust-GRPO)."""

import math

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from rl_rewards.core import gated_rewards

_JIT_POSTERIOR = jax.jit(gated_rewards.posterior_rewards)
_JIT_TRUST = jax.jit(gated_rewards.trust_weighted_rewards,
                     static_argnames=("group_size",))


def _trust_reference(answers, thinking, n, step, big_t=500.0):
  """SophiaVL-R1's `CustomRewardManager.__call__` (n > 0), per group."""
  rewards, weights = [], []
  for start in range(0, len(answers), n):
    a = np.asarray(answers[start:start + n], np.float64)
    h = np.asarray(thinking[start:start + n], np.float64)
    if (a >= 0.9).all() or (a <= 0.1).all():
      process, w = np.zeros(n), 0.0
    else:
      process = np.where(a >= 0.2, h, 0.0)
      correct = a >= 0.5
      c_avg = process[correct].mean() if correct.any() else 0
      w_avg = process[~correct].mean() if (~correct).any() else 0
      w = math.exp(-step / big_t) * 0.3
      if c_avg < w_avg and correct.any():
        w *= np.exp(c_avg - w_avg)
    rewards.extend(a + w * process)
    weights.extend([w] * n)
  return np.array(rewards), np.array(weights)


def test_posterior_hand_computed():
  # R = R_f + R_o + R_o·R_t: the thinking reward of wrong rows 1 and 3 is
  # dropped (an ungated sum gives 1.9 and 1.1).
  out = _JIT_POSTERIOR(np.array([1, 0, 1, 0]), np.array([.7, .9, .2, .1]),
                       np.array([1, 1, 0, 1]))
  np.testing.assert_allclose(out, [2.7, 1.0, 1.2, 1.0], rtol=1e-6)
  # ±1 verifiers: the gate is an indicator, R_o·R_t would give −1.5.
  out = _JIT_POSTERIOR(np.array([1., -1.]), np.array([.5, .5]))
  np.testing.assert_allclose(out, [1.5, -1.0], rtol=1e-6)
  # Wrong rows are never scored by the reward model: NaN there is ignored.
  out = _JIT_POSTERIOR(np.array([1., 0.]), np.array([.5, np.nan]))
  np.testing.assert_allclose(out, [1.5, 0.0], rtol=1e-6)


def test_posterior_jit_matches_eager():
  rng = np.random.default_rng(0)
  args = (rng.integers(0, 2, 6), rng.random(6), rng.integers(0, 2, 6))
  np.testing.assert_allclose(gated_rewards.posterior_rewards(*args),
                             _JIT_POSTERIOR(*args), rtol=1e-6)


# Group 0 (n = 4), step 0: judged h' = [0.2, 0.4, 0.9, 0] (row 3 has
#   a = 0.0 < 0.2: no judge call, h' = 0, still counted among the wrong).
#   μ_c = (0.2 + 0.4)/2 = 0.3, μ_w = (0.9 + 0)/2 = 0.45 -> trust e^{−0.15},
#   w = 0.3·e^{−0.15} = 0.2582124.
#   Catches: no judge threshold (μ_w = 0.85), no trust factor (w = 0.3),
#   the logged e^{2(μ_c − μ_w)} used as trust, a wrong sign of the gap.
# Group 1: every a ≥ 0.9: outcome only, w = 0.
# Group 2: correct rows think better (μ_c = 0.8 > μ_w = 0.05): trust 1;
#   row 1 (a = 0) gets no thinking reward.
# Group 3: no correct row: μ_c = 0 < μ_w but trust stays 1 (code).
_ANSWERS = np.array([1.0, 0.6, 0.3, 0.0,
                     1.0, 1.0, 0.95, 0.9,
                     1.0, 0.0, 1.0, 0.4,
                     0.3, 0.4, 0.2, 0.45], np.float32)
_THINKING = np.array([0.2, 0.4, 0.9, 0.8,
                      0.1, 0.9, 0.5, 0.7,
                      0.9, 0.3, 0.7, 0.1,
                      0.5, 0.6, 0.9, 0.2], np.float32)


def test_trust_hand_computed():
  rewards, weights = _JIT_TRUST(_ANSWERS, _THINKING, 4, step=0)
  w0 = 0.3 * math.exp(-0.15)
  np.testing.assert_allclose(weights, [w0] * 4 + [0] * 4 + [0.3] * 8,
                             rtol=1e-6)
  np.testing.assert_allclose(rewards, [
      1.0 + w0 * 0.2, 0.6 + w0 * 0.4, 0.3 + w0 * 0.9, 0.0,
      1.0, 1.0, 0.95, 0.9,
      1.0 + 0.3 * 0.9, 0.0, 1.0 + 0.3 * 0.7, 0.4 + 0.3 * 0.1,
      0.3 + 0.3 * 0.5, 0.4 + 0.3 * 0.6, 0.2 + 0.3 * 0.9, 0.45 + 0.3 * 0.2,
  ], rtol=1e-6)


def test_trust_ignores_thinking_rewards_never_requested():
  # Group 1 is degenerate and row 3 has a < 0.2: the judge never scored
  # them, so NaN there must not reach any reward.
  thinking = _THINKING.copy()
  thinking[3] = np.nan
  thinking[4:8] = np.nan
  rewards, _ = _JIT_TRUST(_ANSWERS, thinking, 4, step=0)
  expected, _ = _JIT_TRUST(_ANSWERS, _THINKING, 4, step=0)
  np.testing.assert_allclose(rewards, expected, rtol=1e-6)


def test_trust_annealing():
  # w = 0.3·e^{−step/T}: at step = T the weight is 0.3/e (a linear decay
  # or e^{−T/step} fails).
  _, weights = _JIT_TRUST(_ANSWERS, _THINKING, 4, step=500)
  np.testing.assert_allclose(weights[8:], 0.3 / math.e, rtol=1e-6)
  _, weights = _JIT_TRUST(_ANSWERS, _THINKING, 4, step=250,
                          anneal_steps=125.0)
  np.testing.assert_allclose(weights[8:], 0.3 * math.exp(-2), rtol=1e-6)


def test_trust_matches_reference_and_group_permutation():
  rng = np.random.default_rng(1)
  answers = rng.choice([0.0, 0.15, 0.3, 0.5, 0.7, 0.95, 1.0], 64)
  answers = answers.astype(np.float32)
  thinking = rng.random(64).astype(np.float32)
  rewards, weights = _JIT_TRUST(answers, thinking, 8, step=137)
  ref_rewards, ref_weights = _trust_reference(answers, thinking, 8, 137)
  np.testing.assert_allclose(rewards, ref_rewards, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)
  # Permuting the samples of each group permutes the rewards.
  perm = np.concatenate([g * 8 + rng.permutation(8) for g in range(8)])
  permuted, _ = _JIT_TRUST(answers[perm], thinking[perm], 8, step=137)
  np.testing.assert_allclose(permuted, np.asarray(rewards)[perm], rtol=1e-6)


def test_trust_jit_matches_eager():
  args = (_ANSWERS, _THINKING, 4)
  eager = gated_rewards.trust_weighted_rewards(*args, step=10)
  jitted = _JIT_TRUST(*args, step=10)
  for e, j in zip(eager, jitted):
    np.testing.assert_allclose(e, j, rtol=1e-6)


def test_rejects_bad_shapes():
  with pytest.raises(ValueError, match="thinking_rewards"):
    gated_rewards.posterior_rewards(np.ones(3), np.ones(4))
  with pytest.raises(ValueError, match="divisible"):
    gated_rewards.trust_weighted_rewards(np.ones(6), np.ones(6), 4, step=0)


def test_trust_group_of_one_is_finite():
  # Each group of one is degenerate (all correct or all wrong) unless its
  # answer lies strictly between the thresholds.
  rewards, weights = _JIT_TRUST(np.array([1.0, 0.0, 0.5]),
                                np.array([0.9, 0.9, 0.9]), 1, step=0)
  np.testing.assert_allclose(rewards, [1.0, 0.0, 0.5 + 0.3 * 0.9],
                             rtol=1e-6)
  np.testing.assert_allclose(weights, [0, 0, 0.3], rtol=1e-6)


def test_trust_shard_map_matches_single_device():
  # Groups of 4 over 8 devices holding 2 rows each.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  fn = jax.jit(jax.shard_map(
      lambda a, h: gated_rewards.trust_weighted_rewards(
          a, h, 4, step=3, axis_name="data"),
      mesh=mesh, in_specs=P("data"), out_specs=P("data")))
  for s, e in zip(fn(_ANSWERS, _THINKING), _JIT_TRUST(_ANSWERS, _THINKING, 4,
                                                      step=3)):
    np.testing.assert_allclose(s, e, rtol=1e-6)
