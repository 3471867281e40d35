"""Gradient accumulation: an update over micro-batches equals the full-batch
update (parameters and metrics), for every step factory and loss mode.

The batches are ragged (responses of different lengths, one empty row), so
micro-batches hold different token counts and a mean of micro-batch means
would differ from the minibatch mean. Plain SGD with learning rate 1 makes
the parameter change the gradient itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_rewards import core
from rl_rewards import models
from rl_rewards.prm import training
from rl_rewards.train import loss_parts
from rl_rewards.train import state as state_lib
from rl_rewards.train import steps

VOCAB = 13
CFG = models.preset("test", VOCAB).replace(num_layers=1)  # Fast compiles.
B, T, S, GROUP = 16, 12, 4, 4
PROMPT = 4


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, (B, T)).astype(np.int32)
  attention = np.ones((B, T), np.int32)
  attention[1::3, :2] = 0                       # left-padded prompts
  response = np.zeros((B, T), np.float32)
  ends = rng.integers(PROMPT + 1, T + 1, B)
  for b, end in enumerate(ends):
    response[b, PROMPT:end] = 1
    attention[b, end:] = 0
  response[5] = 0                               # an empty (filtered) row
  steps_t = np.minimum((np.arange(T) - PROMPT) // 2, S - 1)
  step_ids = np.where(response > 0, steps_t, -1).astype(np.int32)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return {
      "tokens": tokens, "attention_mask": attention,
      "response_mask": response, "loss_mask": response,
      "old_logprobs": -1.5 + 0.3 * normal(B, T),
      "ref_logprobs": -1.5 + 0.3 * normal(B, T),
      "advantages": normal(B, T),
      "old_values": normal(B, T), "returns": normal(B, T),
      "labels": (rng.random(B) > 0.5).astype(np.float32),
      "step_ids": step_ids,
      "targets": rng.random((B, S)).astype(np.float32),
      "target_mask": rng.random((B, S)) > 0.3,
      "v_target": rng.random(B).astype(np.float32),
      "v_mask": rng.random(B) > 0.2,
  }


@pytest.fixture(scope="module", autouse=True)
def fast_compiles():
  # Every case compiles two model updates; XLA's optimisation passes would
  # dominate the run time, and both sides of each comparison compile alike.
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="module")
def batch():
  return _batch()


@pytest.fixture(scope="module")
def param_sets():
  # Perturbed so the score head and biases matter.
  def noisy(heads, seed):
    p = models.init_params(CFG, jax.random.key(seed), heads=heads)
    rs = np.random.RandomState(seed)
    return jax.tree.map(
        lambda x: x + 0.05 * rs.randn(*x.shape).astype(np.float32), p)
  return {"lm": noisy(("lm",), 0), "score": noisy(("score",), 1),
          "both": noisy(("lm", "score"), 2)}


def _assert_same_update(make, params, batch, *, micro=B // 4):
  """One jitted update with micro-batches of `micro` rows == the full one.

  Tolerances: float32 sums taken in another order, relative to the largest
  entry of each array.
  """
  tx = optax.sgd(1.0)
  state = state_lib.create(params, tx)
  full_state, full_metrics = jax.jit(make(tx, 0))(state, batch)
  micro_state, micro_metrics = jax.jit(make(tx, micro))(state, batch)
  assert set(full_metrics) == set(micro_metrics)
  for key in full_metrics:
    np.testing.assert_allclose(micro_metrics[key], full_metrics[key],
                               rtol=1e-5, atol=1e-6, err_msg=key)
  moved = 0.0
  for got, want, old in zip(jax.tree.leaves(micro_state.params),
                            jax.tree.leaves(full_state.params),
                            jax.tree.leaves(params)):
    scale = max(1e-3, float(np.max(np.abs(np.asarray(want) - old))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-5 * scale)
    moved = max(moved, float(np.max(np.abs(np.asarray(want) - old))))
  assert moved > 1e-4  # The update did something.
  return full_metrics


def test_sft_step(param_sets, batch):
  _assert_same_update(
      lambda tx, m: steps.make_sft_step(CFG, tx, micro_batch_size=m,
                                        chunk_size=5),
      param_sets["lm"], batch)


@pytest.mark.parametrize("mode", core.LOSS_AGG_MODES)
def test_policy_step_every_aggregation(param_sets, batch, mode):
  metrics = _assert_same_update(
      lambda tx, m: steps.make_policy_step(
          CFG, tx, clip_low=0.2, clip_high=0.28, clip_c=3.0,
          loss_agg_mode=mode, kl_coef=0.1, kl_estimator="k3",
          loss_scale=float(T), micro_batch_size=m),
      param_sets["lm"], batch)
  assert {"pg_loss", "kl", "clipfrac", "ppo_kl", "loss", "neg_logprob",
          "grad_norm", "skipped"} <= set(metrics)


def test_value_step(param_sets, batch):
  _assert_same_update(
      lambda tx, m: steps.make_value_step(CFG, tx, clip_range=0.2,
                                          micro_batch_size=m),
      param_sets["score"], batch)


def test_implicit_prm_step_keeps_groups(param_sets, batch):
  _assert_same_update(
      lambda tx, m: steps.make_implicit_prm_step(
          CFG, tx, beta=0.5, group_size=GROUP, micro_batch_size=m),
      param_sets["lm"], batch, micro=2 * GROUP)


@pytest.mark.parametrize("balance", [
    pytest.param(False, marks=pytest.mark.slow), True])
def test_prm_head_step(param_sets, batch, balance):
  _assert_same_update(
      lambda tx, m: training.make_prm_step(
          CFG, tx, num_steps=S, model="head", value_weight=0.5,
          balance_classes=balance, micro_batch_size=m),
      param_sets["score"], batch)


def test_prm_generative_step(param_sets, batch):
  _assert_same_update(
      lambda tx, m: training.make_prm_step(
          CFG, tx, num_steps=S, model="generative", value_weight=1.0,
          micro_batch_size=m, chunk_size=4),
      param_sets["both"], batch)


@pytest.mark.parametrize("loss", [pytest.param("ce", marks=pytest.mark.slow),
                                  "dpo"])
def test_implicit_step(param_sets, batch, loss):
  _assert_same_update(
      lambda tx, m: training.make_implicit_step(
          CFG, tx, beta=0.5, loss=loss, group_size=GROUP,
          micro_batch_size=m),
      param_sets["lm"], batch, micro=GROUP)


def test_micro_batch_must_divide_the_batch(param_sets, batch):
  tx = optax.sgd(1.0)
  step = steps.make_sft_step(CFG, tx, micro_batch_size=6)
  with pytest.raises(ValueError, match="does not divide"):
    jax.jit(step)(state_lib.create(param_sets["lm"], tx), batch)


def test_plain_loss_fn_cannot_accumulate():
  with pytest.raises(ValueError, match="normalizer_fn"):
    steps.make_update_step(lambda p, b: (0.0, {}), optax.sgd(1.0),
                           micro_batch_size=4)


# ------------------------------------------------------ aggregation parts --


@pytest.mark.parametrize("mode", core.LOSS_AGG_MODES)
def test_aggregate_parts_sum_to_the_batch_loss(batch, mode):
  loss = np.random.default_rng(3).standard_normal((B, T)).astype(np.float32)
  mask = batch["response_mask"]
  want = core.aggregate_loss(loss, mask, mode=mode, scale=7.0)
  norms = loss_parts.aggregate_normalizers(mask)
  parts = [loss_parts.aggregate_part(loss[rows], mask[rows], norms,
                                     mode=mode, scale=7.0)
           for rows in np.split(np.arange(B), 4)]
  np.testing.assert_allclose(sum(parts), want, rtol=1e-6)
  # A single part is the core reduction, bit for bit.
  whole = loss_parts.aggregate_part(loss, mask, norms, mode=mode, scale=7.0)
  assert float(whole) == float(want)
  if mode != "seq-mean-token-sum-norm":
    naive = np.mean([core.aggregate_loss(loss[rows], mask[rows], mode=mode)
                     for rows in np.split(np.arange(B), 4)])
    assert abs(naive - float(want)) > 1e-3  # Means of means would be wrong.
