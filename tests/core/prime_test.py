"""Tests for rl_rewards.core.prime (PRIME, implicit PRM rewards)."""

import jax
import numpy as np
import pytest

from rl_rewards.core import prime
from rl_rewards.core import returns
from . import core_reference

_JIT_RLOO = jax.jit(prime.prime_rloo, static_argnames=("group_size", "form"))

# TV-9: two samples, r¹ = [0.1, 0.3], r² = [−0.2] (padded).
_TV9_REWARDS = np.array([[0.1, 0.3], [-0.2, 0.0]], np.float32)
_TV9_MASK = np.array([[1, 1], [1, 0]])


@pytest.mark.parametrize("fn", [prime.prime_rloo, _JIT_RLOO])
def test_rloo_forms_tv9(fn):
  code = fn(_TV9_REWARDS, _TV9_MASK, group_size=2)
  np.testing.assert_allclose(code, [[0.2, 0.6], [-0.4, 0.0]], atol=1e-6)
  np.testing.assert_allclose(returns.reward_to_go(code, _TV9_MASK),
                             [[0.8, 0.6], [-0.4, 0.0]], atol=1e-6)
  paper = fn(_TV9_REWARDS, _TV9_MASK, group_size=2, form="paper")
  np.testing.assert_allclose(paper, [[0.3, 0.5], [-0.4, 0.0]], atol=1e-6)
  np.testing.assert_allclose(returns.reward_to_go(paper, _TV9_MASK),
                             [[0.8, 0.5], [-0.4, 0.0]], atol=1e-6)


def _masked_rloo_reference(rewards, mask, n):
  """verl's `masked_rloo` loop."""
  out = np.where(mask, rewards, 0).astype(np.float64)
  for start in range(0, len(rewards), n):
    means = [out[i][mask[i].astype(bool)].mean() if mask[i].any() else 0.0
             for i in range(start, start + n)]
    baseline = sum(means) / (n - 1)
    for i in range(start, start + n):
      out[i] = np.where(mask[i], out[i] * n / (n - 1) - baseline, 0)
  return out


def test_rloo_random_matches_reference():
  batch = core_reference.random_batch(5, batch=6, length=9)
  np.testing.assert_allclose(
      _JIT_RLOO(batch["rewards"], batch["mask"], group_size=3),
      _masked_rloo_reference(batch["rewards"], batch["mask"], 3),
      rtol=1e-5, atol=1e-5)
  # Group of one: no baseline.
  np.testing.assert_allclose(
      _JIT_RLOO(batch["rewards"], batch["mask"], group_size=1),
      np.where(batch["mask"], batch["rewards"], 0), rtol=1e-6)


def test_outcome_rloo_tv9():
  adv, ret = prime.prime_advantages(
      np.zeros((2, 2), np.float32), np.array([1.0, 0.0], np.float32),
      _TV9_MASK, 2, process_coef=0.0, outcome_coef=1.0)
  np.testing.assert_allclose(ret, [[1.0, 1.0], [-1.0, 0.0]], atol=1e-6)
  assert np.all(np.isfinite(adv))


def test_prime_advantages_compose_the_pieces():
  batch = core_reference.random_batch(6, batch=4, length=7)
  rewards, mask = batch["rewards"], batch["mask"]
  outcome = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  adv, ret = jax.jit(prime.prime_advantages, static_argnums=3)(
      rewards, outcome, mask, 2)
  process_part = _masked_rloo_reference(rewards, mask, 2) * 5.0
  out = np.array([1.0, -1.0, -1.0, 1.0])
  for b in range(4):
    last = np.nonzero(mask[b])[0]
    if last.size:
      process_part[b, last[-1]] += 5.0 * out[b]
  expected_ret = core_reference.reward_to_go_reference(process_part, mask)
  np.testing.assert_allclose(ret, expected_ret, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      adv, core_reference.whiten_reference(expected_ret, mask), rtol=1e-4,
      atol=1e-4)


def test_prime_returns_carry_across_holes():
  # PRIME's return is the reverse cumsum of the masked rewards: with a hole
  # at t = 1, the outcome at t = 2 still reaches t = 0 (a REINFORCE++-style
  # reset at the hole would give G_0 = 0). Zero process rewards; outcomes
  # [1, 0] in one group: RLOO [1, −1] on each row's last valid token.
  mask = np.array([[1, 0, 1], [1, 1, 0]])
  _, ret = prime.prime_advantages(
      np.zeros((2, 3), np.float32), np.array([1.0, 0.0], np.float32), mask,
      2, process_coef=0.0, outcome_coef=1.0)
  np.testing.assert_allclose(ret, [[1.0, 0.0, 1.0], [-1.0, -1.0, 0.0]],
                             atol=1e-6)


def test_implicit_rewards_tv10():
  log_ratios = np.array([[0.2, -0.4, 1.0, 0.6, -0.2]], np.float32)
  mask = np.ones((1, 5))
  q = prime.implicit_q_values(log_ratios, mask, beta=0.05)
  np.testing.assert_allclose(q, [[0.01, -0.01, 0.04, 0.07, 0.06]], atol=1e-7)
  ids = np.array([[0, 0, 1, 1, 1]])
  step = prime.implicit_step_rewards(log_ratios, ids, 2, beta=0.05)
  np.testing.assert_allclose(step, [[-0.01, 0.07]], atol=1e-7)
  np.testing.assert_allclose(np.min(step), -0.01, atol=1e-7)


def test_implicit_token_rewards_and_drop_last():
  logp = np.array([[-1.0, -2.0, -0.5, 0.0]], np.float32)
  ref = np.array([[-1.5, -1.0, -0.5, 3.0]], np.float32)
  mask = np.array([[1, 1, 1, 0]])
  np.testing.assert_allclose(
      prime.implicit_token_rewards(logp, ref, mask, beta=0.5),
      [[0.25, -0.5, 0.0, 0.0]])
  np.testing.assert_allclose(
      prime.implicit_token_rewards(logp, ref, np.array([[1, 1, 0, 0]]),
                                   drop_last_token=True),
      [[0.5, 0.0, 0.0, 0.0]])


def test_batch_norm():
  rewards = np.array([[1.0, -3.0, 1.0], [0.5, 0.5, 9.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0]])
  # Reverse cumsums: row 0 [-1, -2, 1], row 1 [1, 0.5, 0] -> max |.| = 2.
  np.testing.assert_allclose(prime.prime_batch_norm(rewards, mask),
                             np.where(mask, rewards, 0) / (2 + 1e-6),
                             rtol=1e-6)


def test_bad_form_raises():
  with pytest.raises(ValueError, match="form"):
    prime.prime_rloo(_TV9_REWARDS, _TV9_MASK, 2, form="eq5")
  with pytest.raises(ValueError, match="not divisible"):
    prime.prime_rloo(_TV9_REWARDS, _TV9_MASK, 3)
