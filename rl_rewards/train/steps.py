"""Pure training steps: `(state, batch) -> (state, metrics)`.

Each factory closes over the static pieces (model config, optimizer, loss
hyper-parameters) and returns an un-jitted pure function; the runner jits it
once with shardings. Batches are dicts of batch-first arrays in the layout of
docs/data_model.md (prompt slots then response slots, `attention_mask` 1 on
real tokens).

Memory is bounded in two ways. Log-probs go through the chunked LM head
(`chunk_size` positions at a time, `models.lm_head`), never [B, T, V]
logits. With `micro_batch_size` > 0 an update accumulates the gradients of
`B / micro_batch_size` micro-batches (`train.microbatch`) before the one
optimizer step; every loss is written as whole-batch normalisers plus
micro-batch parts (`train.loss_parts`), so the update and its metrics equal
the full-batch ones. `make_logprob_fn` and `make_values_fn` are the
micro-batched forward passes over a rollout.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from rl_rewards import core
from rl_rewards import models
from rl_rewards.train import loss_parts
from rl_rewards.train import microbatch
from rl_rewards.train import state as state_lib

CHUNK = models.DEFAULT_LOGITS_CHUNK


def make_update_step(loss_fn, tx: optax.GradientTransformation,
                     metric_prefix: str = "", *, normalizer_fn=None,
                     micro_batch_size: int = 0, group_size: int = 1,
                     fault=None):
  """`(state, batch) -> (state, metrics)` from a loss function.

  Without `normalizer_fn`, `loss_fn(params, batch)` returns `(loss,
  aux_metrics)` on the whole batch (no accumulation). With it, the loss is
  accumulable:

    norms = normalizer_fn(batch)                  # whole batch, no params
    loss = Σ_j loss_fn(params, micro_j, norms)[0] # and each metric likewise
    grad = Σ_j ∇ loss_fn(params, micro_j, norms)[0]

  over the micro-batches of `microbatch.split_rows` (micro-batch j takes
  rows {i·n + j}, so every micro-batch has rows on every device); a
  `jax.lax.scan` carries the float32 sums, so memory follows the
  micro-batch. The update goes through `state.apply_gradients`, so a
  non-finite loss or gradient is skipped and counted. Optimizer metrics
  (`grad_norm`, `skipped`) get `metric_prefix`.

  Args:
    loss_fn: as above.
    tx: the optimizer.
    metric_prefix: prefix of the optimizer metrics.
    normalizer_fn: `batch -> pytree of arrays`, or None.
    micro_batch_size: rows per micro-batch; 0 = the whole batch at once.
      Must divide the batch (checked when the step is traced).
    group_size: rows of a group that must stay in one micro-batch (losses
      over the samples of a prompt).
    fault: `(step, loss, grads) -> (loss, grads)` applied before the guard,
      with `step` the step counter after this update (`nonfinite.fault_fn`:
      a test hook injecting non-finite values), or None.
  """
  if normalizer_fn is None and micro_batch_size:
    raise ValueError("make_update_step: micro-batches need a loss written "
                     "as normalizer_fn + parts; loss_fn alone cannot be "
                     "accumulated.")

  def update_step(state: state_lib.TrainState, batch):
    if normalizer_fn is None:
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          state.params, batch)
    else:
      norms = jax.lax.stop_gradient(normalizer_fn(batch))
      rows = jax.tree.leaves(batch)[0].shape[0]
      num = microbatch.num_micro_batches(rows, micro_batch_size, group_size,
                                         what="make_update_step")
      grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

      def part(micro):
        (loss, aux), grads = grad_fn(state.params, micro, norms)
        return loss, aux, grads

      loss, aux, grads = microbatch.accumulate(part, batch, num, group_size)
    if fault is not None:
      loss, grads = fault(state.step + 1, loss, grads)
    state, opt_metrics = state_lib.apply_gradients(state, grads, loss, tx)
    return state, {**aux, **{metric_prefix + k: v
                             for k, v in opt_metrics.items()}}

  return update_step


def make_sft_step(model_config: models.ModelConfig,
                  tx: optax.GradientTransformation, *,
                  micro_batch_size: int = 0, chunk_size: int = CHUNK,
                  fault=None):
  """Supervised fine-tuning on reference solutions.

  loss = Σ_{b,t} −log π(x_{b,t} | x_{b,<t})·m_{b,t} / Σ m, with m the
  `loss_mask` (1 on target tokens including EOS); Σ m is counted on the
  whole batch, so micro-batches of `micro_batch_size` rows give the same
  update.

  Batch: `tokens`, `attention_mask`, `loss_mask`, all [B, T].
  """

  def normalizers(batch):
    return {"tokens": core.masked_count(batch["loss_mask"])}

  def loss_fn(params, batch, norms):
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"],
                                 chunk_size=chunk_size)
    mask = batch["loss_mask"].astype(jnp.float32)
    loss = loss_parts.masked_mean_part(-logp, mask, norms["tokens"])
    return loss, {"loss": loss, "tokens": jnp.sum(mask)}

  return make_update_step(loss_fn, tx, normalizer_fn=normalizers,
                          micro_batch_size=micro_batch_size, fault=fault)


def make_eval_loss(model_config: models.ModelConfig, *,
                   chunk_size: int = CHUNK):
  """Teacher-forced loss, exact-match rate and entropy of a batch (no update).

  Over the `loss_mask` tokens that have a context: loss = mean −log π,
  exact_match = fraction of rows whose every such token is the argmax,
  entropy = mean H(π(·|x_{<t})). From `models.token_stats` (chunked head).
  """

  def eval_loss(params, batch):
    stats = models.token_stats(model_config, params, batch["tokens"],
                               batch["attention_mask"], chunk_size=chunk_size)
    valid = batch["attention_mask"].astype(bool)
    context = jnp.pad(valid[:, 1:] & valid[:, :-1], ((0, 0), (1, 0)))
    mask = batch["loss_mask"].astype(bool) & context
    exact = jnp.all(stats.is_argmax | ~mask, axis=-1)
    return {"loss": core.masked_mean(-stats.logprobs, mask),
            "exact_match": jnp.mean(exact.astype(jnp.float32)),
            "entropy": core.masked_mean(stats.entropy, mask)}

  return eval_loss


def make_policy_step(model_config: models.ModelConfig,
                     tx: optax.GradientTransformation, *,
                     clip_low: float, clip_high: float, clip_c: float,
                     loss_agg_mode: str, kl_coef: float, kl_estimator: str,
                     loss_scale: float = 1.0, micro_batch_size: int = 0,
                     chunk_size: int = CHUNK, temperature: float = 1.0,
                     fault=None):
  """One PPO-clip policy update on a rollout (mini)batch.

  Per token (ρ = π_θ/π_old, A the advantage, π_θ of logits / `temperature`,
  the distribution the rollout sampled; π_old must be of the same τ):
    ℓ_t = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high)), dual-clipped at
    −A·c for A < 0 when c > 0; plus kl_coef·KL(π_θ ‖ π_ref)_t when
    kl_coef > 0. Token losses are aggregated over `response_mask` with
    `loss_agg_mode` (docs/algorithms.md), its token and sequence counts
    taken on the whole minibatch (`loss_parts`), so micro-batches of
    `micro_batch_size` rows give the same update.

  `old_logprobs` is log π_old, the policy the ratio is measured against,
  in the convention of `models.token_logprobs` at the same `temperature`
  (entry t = log π(x_t | x_<t)); the sampler's log-probs are untempered, so
  they qualify only at τ = 1 (the RL stage recomputes π_old otherwise,
  `rl.old_logprobs`).

  Batch: `tokens`, `attention_mask`, `response_mask`, `old_logprobs`,
  `advantages` [B, T], plus `ref_logprobs` [B, T] when kl_coef > 0.
  """
  if loss_agg_mode == "seq-mean-token-sum-norm" and loss_scale <= 0:
    raise ValueError("seq-mean-token-sum-norm needs loss_scale > 0.")
  if loss_agg_mode not in core.LOSS_AGG_MODES:
    raise ValueError(f"loss_agg_mode must be one of {core.LOSS_AGG_MODES}, "
                     f"got {loss_agg_mode!r}.")
  dual_clip = clip_c if clip_c > 0 else None

  def normalizers(batch):
    return loss_parts.aggregate_normalizers(batch["response_mask"])

  def loss_fn(params, batch, norms):
    mask = batch["response_mask"].astype(jnp.float32)
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"],
                                 temperature=temperature,
                                 chunk_size=chunk_size)
    agg = functools.partial(loss_parts.aggregate_part, mask=mask, norms=norms,
                            mode=loss_agg_mode, scale=loss_scale)
    mean = functools.partial(loss_parts.masked_mean_part, mask=mask,
                             count=norms["tokens"])
    # core.policy_loss, with the aggregation over whole-batch counts.
    log_ratio = jnp.clip(logp - batch["old_logprobs"], -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    adv = batch["advantages"].astype(jnp.float32)
    token_loss = core.clipped_surrogate_loss(
        ratio, adv, clip_low=clip_low, clip_high=clip_high,
        dual_clip=dual_clip)
    clipped = -adv * jnp.clip(ratio, 1 - clip_low, 1 + clip_high)
    loss = agg(token_loss)
    metrics = {"clipfrac": mean((clipped > -adv * ratio).astype(jnp.float32)),
               "ppo_kl": mean(-log_ratio), "pg_loss": loss}
    if kl_coef > 0:
      kl = core.kl_divergence(logp, batch["ref_logprobs"],
                              estimator=kl_estimator)
      # Aggregation is linear, so this equals aggregating ℓ_t + β·KL_t.
      loss = loss + kl_coef * agg(kl)
      metrics["kl"] = mean(kl)
    metrics["loss"] = loss
    metrics["neg_logprob"] = -mean(logp)
    return loss, metrics

  return make_update_step(loss_fn, tx, normalizer_fn=normalizers,
                          micro_batch_size=micro_batch_size, fault=fault)


def make_logprob_fn(model_config: models.ModelConfig, *,
                    micro_batch_size: int = 0, chunk_size: int = CHUNK,
                    temperature: float = 1.0):
  """`(params, tokens, attention_mask) -> [B, T]` token log-probs (of
  logits / `temperature`).

  The pass runs `micro_batch_size` rows at a time (0: all rows at once) in
  one `jax.lax.map` (`microbatch.map_rows`; a batch that is not a multiple
  is padded), results in row order; used for the reference and
  implicit-PRM log-probs of a rollout.
  """

  def logprob_fn(params, tokens, attention_mask):
    return microbatch.map_rows(
        lambda b: models.token_logprobs(model_config, params, b["tokens"],
                                        b["attention_mask"],
                                        temperature=temperature,
                                        chunk_size=chunk_size),
        {"tokens": tokens, "attention_mask": attention_mask},
        micro_batch_size)

  return logprob_fn


def token_values(model_config: models.ModelConfig, params, tokens,
                 attention_mask):
  """Value model predictions aligned with the tokens, [B, T].

  V_t, the value of the state before token t is generated, is the scalar
  head's output at position t − 1 (the last token of that state); entry 0 is 0.
  """
  scores, _ = models.apply(model_config, params, tokens,
                           attention_mask=attention_mask, head="score")
  return jnp.pad(scores[:, :-1], ((0, 0), (1, 0)))


def make_values_fn(model_config: models.ModelConfig, *,
                   micro_batch_size: int = 0):
  """`(params, tokens, attention_mask) -> [B, T]` `token_values`, computed
  `micro_batch_size` rows at a time (0: all at once), in row order."""

  def values_fn(params, tokens, attention_mask):
    return microbatch.map_rows(
        lambda b: token_values(model_config, params, b["tokens"],
                               b["attention_mask"]),
        {"tokens": tokens, "attention_mask": attention_mask},
        micro_batch_size)

  return values_fn


def make_value_step(model_config: models.ModelConfig,
                    tx: optax.GradientTransformation, *,
                    clip_range: float, loss_agg_mode: str = "token-mean",
                    micro_batch_size: int = 0,
                    fault=None):
  """One clipped value-regression update (PPO critic).

  L = ½·agg(max((V − G)², (clip(V, V_old ± c) − G)²)) over `response_mask`,
  counts of the whole batch (`loss_parts`), accumulated over micro-batches
  of `micro_batch_size` rows.

  Batch: `tokens`, `attention_mask`, `response_mask`, `old_values`,
  `returns` [B, T].
  """

  def normalizers(batch):
    return loss_parts.aggregate_normalizers(batch["response_mask"])

  def loss_fn(params, batch, norms):
    values = token_values(model_config, params, batch["tokens"],
                          batch["attention_mask"])
    mask = batch["response_mask"]
    # core.value_loss, with the aggregation over whole-batch counts.
    old, targets = batch["old_values"], batch["returns"]
    unclipped = jnp.square(values - targets)
    if clip_range > 0:
      clipped = jnp.square(
          jnp.clip(values, old - clip_range, old + clip_range) - targets)
    else:
      clipped = unclipped
    loss = 0.5 * loss_parts.aggregate_part(
        jnp.maximum(unclipped, clipped), mask, norms, mode=loss_agg_mode)
    clipfrac = loss_parts.masked_mean_part(
        (clipped > unclipped).astype(jnp.float32), mask, norms["tokens"])
    return loss, {"value_loss": loss, "value_clipfrac": clipfrac}

  return make_update_step(loss_fn, tx, metric_prefix="value_",
                          normalizer_fn=normalizers,
                          micro_batch_size=micro_batch_size, fault=fault)


def row_normalizers(batch):
  """`{"batch_rows": B}`: for losses that are plain means over rows."""
  rows = jax.tree.leaves(batch)[0].shape[0]
  return {"batch_rows": jnp.float32(rows)}


def make_implicit_prm_step(model_config: models.ModelConfig,
                           tx: optax.GradientTransformation, *, beta: float,
                           group_size: int, micro_batch_size: int = 0,
                           chunk_size: int = CHUNK,
                           fault=None):
  """One implicit-PRM update with cross-entropy on outcome labels (PRIME).

    z_i = β Σ_t m_{i,t} (log π_φ(y_{i,t}) − log π_ref(y_{i,t}));
    L = −Σ_{i∈K} [l_i·log σ(z_i) + (1 − l_i)·log σ(−z_i)] / |K|,
    K = {i : Σ_t m_{i,t} > 0}   (`core.implicit_prm_ce_loss`).

  Rows to train on are those with a non-zero `response_mask`; a row whose
  mask the caller zeroed (PRIME's accuracy filter) is absent: it adds
  nothing to the loss, the metric or the gradient, and is not counted in
  |K|, so the update equals that of the batch without it. |K| and the
  number of groups with such a row are counted on the whole batch
  (`loss_parts.implicit_prm_normalizers`), so micro-batches of
  `micro_batch_size` rows (whole groups of `group_size`: the pairwise
  accuracy metric ranks within groups) give the same update. If no row is
  kept, the loss and the update are 0.

  Batch: `tokens`, `attention_mask`, `response_mask` (all-zero on filtered
  rows), `ref_logprobs` [B, T], `labels` [B].
  Metrics: `prm_loss`; `prm_pairwise_accuracy`, the mean of
  `core.implicit_prm_group_accuracies` over groups with a kept row.
  """

  def normalizers(batch):
    return loss_parts.implicit_prm_normalizers(batch["response_mask"],
                                               group_size)

  def loss_fn(params, batch, norms):
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"],
                                 chunk_size=chunk_size)
    log_ratios = logp - batch["ref_logprobs"]
    mask, labels = batch["response_mask"], batch["labels"]
    present = loss_parts.present_rows(mask)
    loss = loss_parts.masked_mean_part(
        core.implicit_prm_ce_row_losses(log_ratios, mask, labels, beta=beta),
        present, norms["rows"])
    accuracy = loss_parts.masked_mean_part(
        core.implicit_prm_group_accuracies(log_ratios, mask, labels,
                                           group_size),
        jnp.any(present.reshape(-1, group_size), axis=1), norms["groups"])
    return loss, {"prm_loss": loss, "prm_pairwise_accuracy": accuracy}

  return make_update_step(loss_fn, tx, metric_prefix="prm_",
                          normalizer_fn=normalizers,
                          micro_batch_size=micro_batch_size,
                          group_size=group_size, fault=fault)
