"""Tests for step-by-step PPO rewards (advantages.process_token_rewards,
advantages.process_ppo_advantages)."""

import jax
import numpy as np

from rl_rewards.core import advantages

_JIT_REWARDS = jax.jit(advantages.process_token_rewards)
_JIT_PPO = jax.jit(advantages.process_ppo_advantages)

# prompt, s0, s0, s1, s1, s1, pad: steps end at t = 2 and t = 5.
_IDS = np.array([[-1, 0, 0, 1, 1, 1, -1]])
_MASK = _IDS >= 0
_STEP_REWARDS = np.array([[0.5, -0.2, 9.0]], np.float32)  # 9.0: padding.


def _gae_reference(rewards, values, mask, gamma, lam):
  adv = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    valid = np.flatnonzero(mask[b])
    next_v = next_a = 0.0
    for t in valid[::-1]:
      delta = rewards[b, t] + gamma * next_v - values[b, t]
      next_a = delta + gamma * lam * next_a
      next_v = values[b, t]
      adv[b, t] = next_a
  return adv


def test_token_rewards_hand_computed():
  # Step rewards on each step's last token, the outcome (1.0) added on the
  # last valid token, which also ends step 1: [0, 0, .5, 0, 0, .8, 0].
  # Catches: placement on the first token of a step (t = 1, 3), the
  # outcome on a padding token, the padded step's 9.0 leaking in.
  out = _JIT_REWARDS(_STEP_REWARDS, _IDS, _MASK, np.array([1.0]))
  np.testing.assert_allclose(out, [[0, 0, .5, 0, 0, .8, 0]], atol=1e-6)
  # Without an outcome, with −β·KL on every valid token only.
  kl = np.full((1, 7), -0.1, np.float32)
  out = advantages.process_token_rewards(_STEP_REWARDS, _IDS, _MASK,
                                         extra_token_rewards=kl)
  np.testing.assert_allclose(out, [[0, -.1, .4, -.1, -.1, -.3, 0]],
                             atol=1e-6)


def test_ppo_hand_computed():
  # γ = λ = 1, V = 0: A_t = reward-to-go = [0, 1.3, 1.3, .8, .8, .8, 0].
  adv, ret = _JIT_PPO(_STEP_REWARDS, _IDS, _MASK, np.zeros((1, 7)),
                      gamma=1.0, lam=1.0, outcome_scores=np.array([1.0]))
  np.testing.assert_allclose(adv, [[0, 1.3, 1.3, .8, .8, .8, 0]], atol=1e-6)
  np.testing.assert_allclose(ret, adv, atol=1e-6)


def test_ppo_matches_reference_and_padding():
  rng = np.random.default_rng(0)
  ids = np.sort(rng.integers(0, 4, (4, 10)), axis=1)
  ids[:, :2] = -1
  ids[1, 7:] = -1
  mask = ids >= 0
  steps = rng.normal(size=(4, 5)).astype(np.float32)
  values = rng.normal(size=(4, 10)).astype(np.float32)
  outcome = rng.integers(0, 2, 4).astype(np.float32)
  adv, _ = _JIT_PPO(steps, ids, mask, values, gamma=0.9, lam=0.8,
                    outcome_scores=outcome, outcome_coef=2.0)
  # Naive reference: step rewards at step ends, outcome at the last token.
  rewards = np.zeros((4, 10), np.float32)
  for b in range(4):
    valid = np.flatnonzero(mask[b])
    for t in valid:
      if t == valid[-1] or ids[b, t + 1] != ids[b, t]:
        rewards[b, t] += steps[b, ids[b, t]]
    rewards[b, valid[-1]] += 2.0 * outcome[b]
  np.testing.assert_allclose(adv, _gae_reference(rewards, values, mask, 0.9,
                                                 0.8), rtol=1e-4, atol=1e-5)
  # Padding: junk values and ids under a zero mask change nothing, even
  # ids that continue the last step (its end must stay on the last valid
  # token, not move onto padding).
  pad_ids = np.concatenate([ids, np.repeat(ids.max(1, keepdims=True), 3, 1)],
                           axis=1)
  pad_ids[1, 7:] = ids[1, 6]
  padded, _ = _JIT_PPO(steps, pad_ids,
                       np.pad(mask, ((0, 0), (0, 3))),
                       np.pad(values, ((0, 0), (0, 3)), constant_values=4.),
                       gamma=0.9, lam=0.8, outcome_scores=outcome,
                       outcome_coef=2.0)
  np.testing.assert_allclose(np.asarray(padded)[:, :10], adv, rtol=1e-5,
                             atol=1e-6)
  # Eager == jit for the placement (GAE's own variants: returns_test).
  np.testing.assert_allclose(
      advantages.process_token_rewards(steps, ids, mask, outcome,
                                       outcome_coef=2.0),
      _JIT_REWARDS(steps, ids, mask, outcome, outcome_coef=2.0), rtol=1e-6)
