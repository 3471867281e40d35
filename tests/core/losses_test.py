"""Tests for rl_rewards.core.losses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards.core import losses

_JIT_AGG = jax.jit(losses.aggregate_loss, static_argnames=("mode", "scale"))
_JIT_SURROGATE = jax.jit(losses.clipped_surrogate_loss,
                         static_argnames=("clip_low", "clip_high",
                                          "dual_clip"))


@pytest.mark.parametrize("jit", [False, True])
def test_aggregation_tv5(jit):
  fn = _JIT_AGG if jit else losses.aggregate_loss
  loss = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 0, 0]])
  assert np.isclose(fn(loss, mask, mode="token-mean"), 2.5)
  assert np.isclose(fn(loss, mask, mode="seq-mean-token-sum"), 5.0)
  assert np.isclose(fn(loss, mask, mode="seq-mean-token-mean"), 3.0)
  assert np.isclose(fn(loss, mask, mode="seq-mean-token-sum-norm"), 10 / 3)
  assert np.isclose(fn(loss, mask, mode="seq-mean-token-sum-norm", scale=5.0),
                    2.0)


def test_aggregation_empty_rows_and_batch():
  loss = np.array([[1.0, 2.0], [np.nan, 7.0]], np.float32)
  mask = np.array([[1, 1], [0, 0]])
  # The empty row is left out of the sequence means; NaN under the mask is
  # ignored.
  assert np.isclose(_JIT_AGG(loss, mask, mode="seq-mean-token-mean"), 1.5)
  assert np.isclose(_JIT_AGG(loss, mask, mode="seq-mean-token-sum"), 3.0)
  for mode in losses.LOSS_AGG_MODES:
    assert float(_JIT_AGG(loss, np.zeros((2, 2)), mode=mode)) == 0.0


@pytest.mark.parametrize("jit", [False, True])
def test_ppo_clip_tv6(jit):
  fn = _JIT_SURROGATE if jit else losses.clipped_surrogate_loss
  ratio = np.array([[1.3, 0.7, 0.7, 1.3, 5.0, 1.25]], np.float32)
  adv = np.array([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]], np.float32)
  np.testing.assert_allclose(fn(ratio, adv, clip_low=0.2, dual_clip=3.0),
                             [[-1.2, -0.7, 0.8, 1.3, 3.0, -1.2]], atol=1e-6)
  np.testing.assert_allclose(fn(ratio, adv, clip_low=0.2)[0, 4], 5.0)
  dapo = fn(ratio, adv, clip_low=0.2, clip_high=0.28)
  np.testing.assert_allclose(dapo[0, [0, 5]], [-1.28, -1.25], atol=1e-6)


def test_policy_loss_metrics_and_gradient():
  logp = jnp.log(jnp.array([[1.3, 0.7, 1.0]], jnp.float32))
  old = jnp.zeros((1, 3))
  adv = jnp.array([[1.0, 1.0, 2.0]])
  mask = jnp.array([[1, 1, 0]])
  loss, metrics = jax.jit(losses.policy_loss)(logp, old, adv, mask)
  np.testing.assert_allclose(loss, (-1.2 - 0.7) / 2, atol=1e-6)
  np.testing.assert_allclose(metrics["clipfrac"], 0.5)
  np.testing.assert_allclose(metrics["ppo_kl"],
                             -(np.log(1.3) + np.log(0.7)) / 2, rtol=1e-6)
  grad = jax.jit(jax.grad(
      lambda lp: losses.policy_loss(lp, old, adv, mask)[0]))(logp)
  # Clipped token (ρ = 1.3 > 1.2, A > 0) and masked token get no gradient;
  # d(−A·ρ)/d log π = −A·ρ = −0.7 halved by the token mean.
  np.testing.assert_allclose(grad, [[0.0, -0.35, 0.0]], atol=1e-6)


def test_value_loss():
  values = np.array([[1.0, 0.0, 3.0]], np.float32)
  old = np.array([[0.0, 0.0, 0.0]], np.float32)
  targets = np.array([[2.0, 1.0, 5.0]], np.float32)
  mask = np.array([[1, 1, 0]])
  loss, clipfrac = losses.value_loss(values, old, targets, mask,
                                     clip_range=0.5)
  # Token 0: max((1−2)², (0.5−2)²) = 2.25; token 1: max(1, 1) = 1.
  np.testing.assert_allclose(loss, 0.5 * (2.25 + 1.0) / 2, atol=1e-6)
  np.testing.assert_allclose(clipfrac, 0.5)
  loss, _ = losses.value_loss(values, old, targets, mask, clip_range=None)
  np.testing.assert_allclose(loss, 0.5 * (1.0 + 1.0) / 2, atol=1e-6)


def test_kl_estimators_tv13():
  logp = np.array([[-1.0]], np.float32)
  ref = np.array([[-1.5]], np.float32)
  for name, expected in (("k1", 0.5), ("abs", 0.5), ("k2", 0.125),
                         ("k3", 0.106531), ("low_var_kl", 0.106531)):
    np.testing.assert_allclose(
        losses.kl_divergence(logp, ref, estimator=name), [[expected]],
        atol=1e-6)
  huge = losses.kl_divergence(np.array([[-50.0]]), np.array([[0.0]]),
                              estimator="k3")
  np.testing.assert_allclose(huge, [[10.0]])  # Clamped, finite.


def test_straight_through_kl_has_k2_gradient():
  ref = jnp.array([[-1.5, 0.3]])

  def total(lp, estimator):
    return jnp.sum(losses.kl_divergence(lp, ref, estimator=estimator))

  logp = jnp.array([[-1.0, 0.1]])
  np.testing.assert_allclose(total(logp, "k3+"), total(logp, "k3"),
                             rtol=1e-6)
  np.testing.assert_allclose(jax.grad(total)(logp, "k3+"), logp - ref,
                             rtol=1e-6)


def test_implicit_prm_ce_tv9():
  # Σq = [4, −2], β = 0.05: σ = [0.549834, 0.475021]; CE mean 0.621268.
  log_ratios = np.array([[1.0, 3.0, 9.0], [-2.0, 0.0, 9.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0]])
  loss = losses.implicit_prm_ce_loss(log_ratios, mask,
                                     np.array([1.0, 0.0]), beta=0.05)
  np.testing.assert_allclose(loss, 0.621268, atol=1e-6)


def test_implicit_prm_ce_leaves_out_rows_without_a_response():
  # TV-9 plus two filtered rows (all-zero mask, whatever their log-ratios and
  # labels): the loss and its gradient are those of the two kept rows. A
  # mean over all four rows would give (2·0.621268 + 2·log 2)/4 = 0.657207.
  log_ratios = np.array([[1.0, 3.0, 9.0], [5.0, 5.0, 5.0],
                         [-2.0, 0.0, 9.0], [-7.0, 1.0, 2.0]], np.float32)
  mask = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]])
  labels = np.array([1.0, 1.0, 0.0, 0.0])
  kept = np.array([0, 2])

  def loss_of(rows):
    return lambda x: losses.implicit_prm_ce_loss(x, mask[rows], labels[rows],
                                                 beta=0.05)

  loss = loss_of(np.arange(4))
  np.testing.assert_allclose(loss(log_ratios), 0.621268, atol=1e-6)
  grad = np.asarray(jax.grad(loss)(log_ratios))
  np.testing.assert_allclose(grad[kept],
                             jax.grad(loss_of(kept))(log_ratios[kept]),
                             rtol=1e-6)
  np.testing.assert_allclose(grad[[1, 3]], 0.0)
  # By hand: ∂L/∂x_{i,t} = −β·m_{i,t}·(y_i − σ(z_i)) / 2;
  # row 0: −0.05·(1 − 0.549834)/2 = −0.011254.
  np.testing.assert_allclose(grad[0], [-0.011254, -0.011254, 0.0],
                             atol=1e-6)
  rows = losses.implicit_prm_ce_row_losses(log_ratios, mask, labels,
                                           beta=0.05)
  np.testing.assert_allclose(np.asarray(rows)[[1, 3]], 0.0)
  # Nothing kept: 0, not NaN.
  assert float(losses.implicit_prm_ce_loss(
      log_ratios, np.zeros_like(mask), labels, beta=0.05)) == 0.0


def _dpo_reference(q, y, n, beta):
  out = []
  for i in range(len(q)):
    g = range(i // n * n, i // n * n + n)
    peers = [q[j] for j in g if (y[j] < y[i] if y[i] > 0 else y[j] > y[i])]
    other = np.mean(peers) * beta if peers else 0.0
    z = (q[i] * beta - other) * (1 if y[i] > 0 else -1)
    out.append(np.log1p(np.exp(-z)))
  return np.mean(out)


def test_implicit_prm_dpo_matches_reference():
  rng = np.random.default_rng(0)
  log_ratios = rng.standard_normal((6, 4)).astype(np.float32) * 3
  mask = np.ones((6, 4))
  labels = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], np.float32)
  loss = jax.jit(losses.implicit_prm_dpo_loss, static_argnums=3,
                 static_argnames="beta")(log_ratios, mask, labels, 3,
                                         beta=0.5)
  np.testing.assert_allclose(
      loss, _dpo_reference(log_ratios.sum(1), labels, 3, 0.5), rtol=1e-5)


def test_pairwise_accuracy():
  log_ratios = np.array([[2.0], [1.0], [0.0], [3.0], [1.0], [1.0]],
                        np.float32)
  labels = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  # Group 0 (Q = [2, 1, 0], y = [1, 0, 1]): pair (0, 1) right, (0, 2) has
  # weight 0, (1, 2) wrong -> 0.5. Group 1 (Q = [3, 1, 1], y = [1, 0, 0]):
  # (0, 1) and (0, 2) right, (1, 2) weight 0 -> 1.0.
  acc = losses.implicit_prm_pairwise_accuracy(log_ratios, np.ones((6, 1)),
                                              labels, 3)
  np.testing.assert_allclose(acc, 0.75)
  same = losses.implicit_prm_pairwise_accuracy(log_ratios, np.ones((6, 1)),
                                               np.ones(6), 3)
  np.testing.assert_allclose(same, 0.5)  # All labels equal.


def test_pairwise_accuracy_leaves_out_absent_rows_and_groups():
  # Group 1 of the case above, plus a filtered group (all-zero mask) that
  # would score 0.5 and pull the mean to 0.75; and in group 0 a filtered
  # row whose Q = 0 would make pair (0, 2) wrong (Q 0 < 2 with y 1 > 0).
  log_ratios = np.array([[3.0], [1.0], [9.0], [3.0], [1.0], [1.0]],
                        np.float32)
  labels = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
  mask = np.array([[1], [1], [0], [0], [0], [0]])
  # Group 0 without row 2: one pair (0, 1), right -> 1.0. Group 1: absent.
  np.testing.assert_allclose(
      losses.implicit_prm_group_accuracies(log_ratios, mask, labels, 3),
      [1.0, 0.5])
  np.testing.assert_allclose(
      losses.implicit_prm_pairwise_accuracy(log_ratios, mask, labels, 3), 1.0)


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="mode"):
    losses.aggregate_loss(np.ones((1, 2)), np.ones((1, 2)), mode="mean")
  with pytest.raises(ValueError, match="dual_clip"):
    losses.clipped_surrogate_loss(np.ones(2), np.ones(2), dual_clip=0.5)
  with pytest.raises(ValueError, match="estimator"):
    losses.kl_divergence(np.ones(2), np.ones(2), estimator="k4")
