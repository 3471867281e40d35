"""Tests for rl_rewards.core.returns (GAE, discounted and min-form returns)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards.core import returns
from . import core_reference

_JIT_GAE = jax.jit(returns.gae)
_JIT_DISCOUNTED = jax.jit(returns.discounted_returns)
_JIT_MIN_FORM = jax.jit(returns.min_form_returns, static_argnames="form")
_JIT_TOKEN_MIN = jax.jit(returns.token_min_form_returns)


@pytest.mark.parametrize("gae_fn", [returns.gae, _JIT_GAE])
def test_gae_hand_computed_tv1(gae_fn):
  # TV-1: δ = [0.1, 0.1, 0.1, 0.2]; A_3 = 0.2, A_2 = 0.1 + 0.95·0.2 = 0.29,
  # A_1 = 0.1 + 0.95·0.29 = 0.3755, A_0 = 0.1 + 0.95·0.3755 = 0.456725.
  r = np.array([[0, 0, 0, 1.0]], np.float32)
  v = np.array([[0.5, 0.6, 0.7, 0.8]], np.float32)
  adv, ret = gae_fn(r, v, np.ones((1, 4)), gamma=1.0, lam=0.95)
  np.testing.assert_allclose(adv, [[0.456725, 0.3755, 0.29, 0.2]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.956725, 0.9755, 0.99, 1.0]], atol=1e-6)
  adv, ret = gae_fn(r, v, np.ones((1, 4)), gamma=0.9, lam=0.95)
  np.testing.assert_allclose(adv, [[0.205276, 0.193305, 0.191, 0.2]],
                             atol=1e-6)
  np.testing.assert_allclose(ret, [[0.705276, 0.793305, 0.891, 1.0]],
                             atol=1e-6)


def test_gae_tv2_ignores_values_after_the_last_valid_token():
  # TV-2: V_pad = 9.9 must not be bootstrapped; the padded slot is 0 here
  # (verl leaves garbage there).
  adv, ret = _JIT_GAE(np.array([[0, 0, 1, 0.0]]),
                      np.array([[0.5, 0.6, 0.7, 9.9]]),
                      np.array([[1, 1, 1, 0]]), gamma=1.0, lam=0.95)
  np.testing.assert_allclose(adv, [[0.46575, 0.385, 0.3, 0.0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.96575, 0.985, 1.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("length", [12, 300])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_contiguous_rows_match_verl_loop(length, gamma, lam):
  # length 300 spans many chunks of the closed form (C = 16, padded to 304).
  batch = core_reference.random_batch(7, batch=5, length=length)
  r, v, m = batch["rewards"], batch["values"], batch["mask"]
  adv, ret = _JIT_GAE(r, v, m, gamma=gamma, lam=lam)
  ref_adv, ref_ret = core_reference.gae_reference(r, v, m, gamma, lam)
  np.testing.assert_allclose(adv, ref_adv, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(ret, ref_ret, rtol=2e-4, atol=2e-4)


def test_gae_rows_with_holes_match_verl_loop():
  # Masked tokens inside a row (e.g. tool output) carry the running values.
  batch = core_reference.random_batch(8, batch=5, length=12)
  holes = np.random.default_rng(0).random((5, 12)) < 0.3
  m = batch["mask"] * ~holes
  r, v = batch["rewards"], batch["values"]
  adv, ret = _JIT_GAE(r, v, m, gamma=0.95, lam=0.9)
  ref_adv, ref_ret = core_reference.gae_reference(r, v, m, 0.95, 0.9)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_padding_invariance_and_garbage():
  batch = core_reference.random_batch(9, batch=4, length=10)
  r, v, m = batch["rewards"], batch["values"], batch["mask"]
  pad = ((0, 0), (0, 6))
  adv, ret = _JIT_GAE(np.pad(r, pad, constant_values=np.nan),
                      np.pad(v, pad, constant_values=1e6), np.pad(m, pad),
                      gamma=0.99, lam=0.95)
  small_adv, small_ret = _JIT_GAE(r, v, m, gamma=0.99, lam=0.95)
  np.testing.assert_allclose(adv[:, :10], small_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ret[:, :10], small_ret, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv[:, 10:], 0.0)
  assert np.all(np.isfinite(adv)) and np.all(np.isfinite(ret))
  np.testing.assert_allclose(adv[0], 0.0)  # All-padding row.


def test_gae_traced_hyperparameters():
  batch = core_reference.random_batch(10, batch=3, length=8)
  fn = jax.jit(lambda g, l: returns.gae(batch["rewards"], batch["values"],
                                        batch["mask"], gamma=g, lam=l))
  adv, _ = fn(jnp.float32(0.9), jnp.float32(0.5))
  ref, _ = core_reference.gae_reference(batch["rewards"], batch["values"],
                                        batch["mask"], 0.9, 0.5)
  np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_discounted_returns_match_reference(gamma):
  batch = core_reference.random_batch(11, batch=5, length=40)
  r, m = batch["rewards"], batch["mask"]
  np.testing.assert_allclose(
      _JIT_DISCOUNTED(r, m, gamma=gamma),
      core_reference.discounted_returns_reference(r, m, gamma),
      rtol=1e-5, atol=1e-5)
  holes = m * (np.random.default_rng(1).random(m.shape) > 0.3)
  np.testing.assert_allclose(
      _JIT_DISCOUNTED(r, holes, gamma=gamma),
      core_reference.discounted_returns_reference(r, holes, gamma),
      rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [returns.discounted_returns, _JIT_DISCOUNTED])
def test_discounted_returns_reset_at_holes_hand_computed(fn):
  # verl's REINFORCE++ loop resets the running return at an invalid token.
  # Row 0, γ = 0.5, hole at t = 2: G_3 = 4; the hole cuts the return, so
  # G_1 = 2 + 0.5·0 = 2 and G_0 = 1 + 0.5·2 = 2. (Carrying through the hole
  # would give G_1 = 2 + 0.5·4 = 4, G_0 = 3.)
  # Row 1: prompt at t = 0, holes at t = 2 and 3, padding at t = 5;
  # G_4 = 5, G_1 = 2 (its reward 7 at the hole t = 3 is ignored), G_0 = 0.
  r = np.array([[1.0, 2.0, 3.0, 4.0, 0.0, 0.0],
                [9.0, 2.0, 7.0, 7.0, 5.0, 9.0]], np.float32)
  m = np.array([[1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0]])
  np.testing.assert_allclose(fn(r, m, gamma=0.5),
                             [[2.0, 2.0, 0.0, 4.0, 0.0, 0.0],
                              [0.0, 2.0, 0.0, 0.0, 5.0, 0.0]], atol=1e-6)
  # γ = 1: [3, 2, 0, 4] (carrying would give [7, 6, 0, 4]).
  np.testing.assert_allclose(fn(r[:1], m[:1], gamma=1.0),
                             [[3.0, 2.0, 0.0, 4.0, 0.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("fn", [returns.reward_to_go,
                                jax.jit(returns.reward_to_go)])
def test_reward_to_go_carries_across_holes_hand_computed(fn):
  # PRIME/PURE reverse cumsum of the masked rewards: the reward after the
  # hole still reaches t = 0, 1; the hole's own reward (3) is dropped.
  r = np.array([[1.0, 2.0, 3.0, 4.0, 9.0]], np.float32)
  m = np.array([[1, 1, 0, 1, 0]])
  np.testing.assert_allclose(fn(r, m), [[7.0, 6.0, 0.0, 4.0, 0.0]],
                             atol=1e-6)


def test_reward_to_go_matches_reference_and_contiguous_returns():
  batch = core_reference.random_batch(12, batch=5, length=40)
  r, m = batch["rewards"], batch["mask"]
  holes = m * (np.random.default_rng(2).random(m.shape) > 0.3)
  np.testing.assert_allclose(
      jax.jit(returns.reward_to_go)(r, holes),
      core_reference.reward_to_go_reference(r, holes), rtol=1e-5, atol=1e-5)
  # Without holes it is the γ = 1 REINFORCE++ return.
  np.testing.assert_allclose(jax.jit(returns.reward_to_go)(r, m),
                             _JIT_DISCOUNTED(r, m, gamma=1.0),
                             rtol=1e-5, atol=1e-5)


def test_discounted_returns_tv4_eager():
  out = returns.discounted_returns(
      np.array([[-0.01, -0.02, 0.99], [-0.03, -0.01, 0.0]]),
      np.array([[1, 1, 1], [1, 1, 0]]), gamma=1.0)
  np.testing.assert_allclose(out, [[0.96, 0.97, 0.99], [-0.04, -0.01, 0.0]],
                             atol=1e-6)


def test_step_returns_hand_computed():
  # TV-12 raw returns [2.3, 1.4, 0.8]; with γ = 0.5 skipping the masked step:
  # G_2 = 0.8, G_0 = 0.9 + 0.5·0.8 = 1.3.
  r = np.array([[0.9, 0.6, 0.8]])
  np.testing.assert_allclose(returns.step_returns(r, np.ones((1, 3))),
                             [[2.3, 1.4, 0.8]], atol=1e-6)
  np.testing.assert_allclose(
      returns.step_returns(r, np.array([[1, 0, 1]]), gamma=0.5),
      [[1.3, 0.0, 0.8]], atol=1e-6)


@pytest.mark.parametrize("min_form", [returns.min_form_returns, _JIT_MIN_FORM])
def test_min_form_tv7(min_form):
  r = np.array([[0.8, -0.4, 0.6], [-0.4, 0.5, -0.4]], np.float32)
  m = np.ones((2, 3))
  np.testing.assert_allclose(min_form(r, m),
                             [[-0.4, -0.4, 0.6], [-0.4, -0.4, -0.4]])
  # Paper definition: zero after the first argmin (w = 1 and w = 0).
  np.testing.assert_allclose(min_form(r, m, form="paper"),
                             [[-0.4, -0.4, 0.0], [-0.4, 0.0, 0.0]])


@pytest.mark.parametrize("form", ["running_min", "paper"])
def test_min_form_random_matches_reference(form):
  rng = np.random.default_rng(3)
  r = rng.standard_normal((6, 7)).astype(np.float32)
  counts = np.array([0, 1, 7, 3, 5, 2])
  m = np.arange(7)[None, :] < counts[:, None]
  expected = core_reference.running_min_reference(r, m, paper=form == "paper")
  np.testing.assert_allclose(_JIT_MIN_FORM(r, m, form=form), expected)
  # Padding invariance: extra invalid steps with huge negative rewards.
  r_pad = np.pad(r, ((0, 0), (0, 3)), constant_values=-100.0)
  m_pad = np.pad(m, ((0, 0), (0, 3)))
  np.testing.assert_allclose(
      _JIT_MIN_FORM(r_pad, m_pad, form=form)[:, :7], expected)


def test_token_min_form_matches_pure_loop():
  batch = core_reference.random_batch(12, batch=5, length=30)
  ends = np.asarray(batch["ids"] >= 0) & np.r_[
      batch["ids"][:, 1:].T, np.full((1, 5), -1)].T.__ne__(batch["ids"])
  token_rewards = np.where(ends, batch["rewards"], 0).astype(np.float32)
  expected = core_reference.pure_token_min_reference(token_rewards,
                                                     batch["mask"])
  np.testing.assert_allclose(_JIT_TOKEN_MIN(token_rewards, batch["mask"]),
                             expected)
  np.testing.assert_allclose(
      returns.token_min_form_returns(token_rewards[:2, :9],
                                     batch["mask"][:2, :9]),
      core_reference.pure_token_min_reference(token_rewards[:2, :9],
                                              batch["mask"][:2, :9]))


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="form"):
    returns.min_form_returns(np.ones((1, 2)), np.ones((1, 2)), form="soft")
  with pytest.raises(ValueError, match="shapes must match"):
    returns.gae(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 3)), gamma=1.0,
                lam=1.0)
  with pytest.raises(ValueError, match=r"rank 2 \[B, T\]"):
    returns.discounted_returns(np.ones(3), np.ones(3))

