"""Pure training steps: `(state, batch) -> (state, metrics)`.

Each factory closes over the static pieces (model config, optimizer, loss
hyper-parameters) and returns an un-jitted pure function; the runner jits it
once with shardings. Batches are dicts of batch-first arrays in the layout of
DESIGN §4 (prompt slots then response slots, `attention_mask` 1 on real
tokens).
"""

import functools

import jax
import jax.numpy as jnp
import optax

from rl_rewards import core
from rl_rewards import models
from rl_rewards.train import state as state_lib


def make_update_step(loss_fn, tx: optax.GradientTransformation,
                     metric_prefix: str = ""):
  """`(state, batch) -> (state, metrics)` from `loss_fn(params, batch)`.

  `loss_fn` returns `(loss, aux_metrics)`; the update goes through
  `state.apply_gradients`, so a non-finite loss or gradient is skipped and
  counted. Optimizer metrics (`grad_norm`, `skipped`) get `metric_prefix`.
  """

  def update_step(state: state_lib.TrainState, batch):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch)
    state, opt_metrics = state_lib.apply_gradients(state, grads, loss, tx)
    return state, {**aux, **{metric_prefix + k: v
                             for k, v in opt_metrics.items()}}

  return update_step


def _sequence_nll(model_config, params, batch):
  logp = models.token_logprobs(model_config, params, batch["tokens"],
                               batch["attention_mask"])
  mask = batch["loss_mask"].astype(jnp.float32)
  return -logp, mask


def make_sft_step(model_config: models.ModelConfig,
                  tx: optax.GradientTransformation):
  """Supervised fine-tuning on reference solutions.

  loss = Σ_{b,t} −log π(x_{b,t} | x_{b,<t})·m_{b,t} / Σ m, with m the
  `loss_mask` (1 on target tokens including EOS).

  Batch: `tokens`, `attention_mask`, `loss_mask`, all [B, T].
  """

  def loss_fn(params, batch):
    nll, mask = _sequence_nll(model_config, params, batch)
    loss = core.masked_mean(nll, mask)
    return loss, {"loss": loss, "tokens": jnp.sum(mask)}

  return make_update_step(loss_fn, tx)


def make_eval_loss(model_config: models.ModelConfig):
  """Teacher-forced loss and exact-match rate of a batch (no update)."""

  def eval_loss(params, batch):
    logits = models.apply(model_config, params, batch["tokens"],
                          attention_mask=batch["attention_mask"])[0]
    mask = batch["loss_mask"][:, 1:].astype(bool)
    target = batch["tokens"][:, 1:]
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    correct = jnp.argmax(logits[:, :-1], axis=-1) == target
    exact = jnp.all(correct | ~mask, axis=-1)
    return {"loss": core.masked_mean(nll, mask),
            "exact_match": jnp.mean(exact.astype(jnp.float32))}

  return eval_loss


def make_policy_step(model_config: models.ModelConfig,
                     tx: optax.GradientTransformation, *,
                     clip_low: float, clip_high: float, clip_c: float,
                     loss_agg_mode: str, kl_coef: float, kl_estimator: str,
                     loss_scale: float = 1.0):
  """One PPO-clip policy update on a rollout (mini)batch.

  Per token (ρ = π_θ/π_old, A the advantage):
    ℓ_t = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high)), dual-clipped at
    −A·c for A < 0 when c > 0; plus kl_coef·KL(π_θ ‖ π_ref)_t when
    kl_coef > 0. Token losses are aggregated over `response_mask` with
    `loss_agg_mode` (spec/algorithms.md §1.6).

  Batch: `tokens`, `attention_mask`, `response_mask`, `old_logprobs`,
  `advantages` [B, T], plus `ref_logprobs` [B, T] when kl_coef > 0.
  """
  if loss_agg_mode == "seq-mean-token-sum-norm" and loss_scale <= 0:
    raise ValueError("seq-mean-token-sum-norm needs loss_scale > 0.")

  def loss_fn(params, batch):
    mask = batch["response_mask"].astype(jnp.float32)
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"])
    loss, metrics = core.policy_loss(
        logp, batch["old_logprobs"], batch["advantages"], mask,
        clip_low=clip_low, clip_high=clip_high,
        dual_clip=clip_c if clip_c > 0 else None,
        loss_agg_mode=loss_agg_mode, loss_scale=loss_scale)
    metrics = dict(metrics, pg_loss=loss)
    if kl_coef > 0:
      kl = core.kl_divergence(logp, batch["ref_logprobs"],
                              estimator=kl_estimator)
      # Aggregation is linear, so this equals aggregating ℓ_t + β·KL_t.
      loss = loss + kl_coef * core.aggregate_loss(
          kl, mask, mode=loss_agg_mode, scale=loss_scale)
      metrics["kl"] = core.masked_mean(kl, mask)
    metrics["loss"] = loss
    metrics["neg_logprob"] = -core.masked_mean(logp, mask)
    return loss, metrics

  return make_update_step(loss_fn, tx)


def make_logprob_fn(model_config: models.ModelConfig):
  """`(params, tokens, attention_mask) -> [B, T]` token log-probs."""
  return functools.partial(models.token_logprobs, model_config)


def token_values(model_config: models.ModelConfig, params, tokens,
                 attention_mask):
  """Value model predictions aligned with the tokens, [B, T].

  V_t, the value of the state before token t is generated, is the scalar
  head's output at position t − 1 (the last token of that state); entry 0 is 0.
  """
  scores, _ = models.apply(model_config, params, tokens,
                           attention_mask=attention_mask, head="score")
  return jnp.pad(scores[:, :-1], ((0, 0), (1, 0)))


def make_value_step(model_config: models.ModelConfig,
                    tx: optax.GradientTransformation, *,
                    clip_range: float, loss_agg_mode: str = "token-mean"):
  """One clipped value-regression update (PPO critic).

  L = ½·agg(max((V − G)², (clip(V, V_old ± c) − G)²)) over `response_mask`.

  Batch: `tokens`, `attention_mask`, `response_mask`, `old_values`,
  `returns` [B, T].
  """

  def loss_fn(params, batch):
    values = token_values(model_config, params, batch["tokens"],
                          batch["attention_mask"])
    loss, clipfrac = core.value_loss(
        values, batch["old_values"], batch["returns"], batch["response_mask"],
        clip_range=clip_range if clip_range > 0 else None,
        loss_agg_mode=loss_agg_mode)
    return loss, {"value_loss": loss, "value_clipfrac": clipfrac}

  return make_update_step(loss_fn, tx, metric_prefix="value_")


def make_implicit_prm_step(model_config: models.ModelConfig,
                           tx: optax.GradientTransformation, *, beta: float,
                           group_size: int):
  """One implicit-PRM update with cross-entropy on outcome labels (PRIME).

  r_φ(y) = β Σ_t m_t (log π_φ(y_t) − log π_ref(y_t));
  L = −mean[l·log σ(r_φ) + (1 − l)·log(1 − σ(r_φ))] over rows with weight.

  Batch: `tokens`, `attention_mask`, `response_mask` (rows to train on;
  filtered rows have an all-zero mask), `ref_logprobs` [B, T], `labels` [B].
  """

  def loss_fn(params, batch):
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"])
    log_ratios = logp - batch["ref_logprobs"]
    loss = core.implicit_prm_ce_loss(log_ratios, batch["response_mask"],
                                     batch["labels"], beta=beta)
    accuracy = core.implicit_prm_pairwise_accuracy(
        log_ratios, batch["response_mask"], batch["labels"], group_size)
    return loss, {"prm_loss": loss, "prm_pairwise_accuracy": accuracy}

  return make_update_step(loss_fn, tx, metric_prefix="prm_")
