"""Losses: PPO policy and value losses, KL estimators, loss aggregation, and
the implicit-PRM losses.

Token losses are [B, T] and reduced by `aggregate_loss` under one of verl's
modes; the policy and value losses follow verl's `compute_policy_loss_vanilla`
and `compute_value_loss`.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import masking

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
_KL_ALIASES = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3",
               "low_var_kl": "k3", "abs": "abs"}


def kl_divergence(logprobs, ref_logprobs, *, estimator: str = "k1"):
  """Per-token KL estimators of KL(π‖π_ref) from sampled log-probabilities.

    Δ = log π − log π_ref;   k1 = Δ;   abs = |Δ|;   k2 = Δ²/2;
    k3 (low_var_kl) = e^{−Δ} + Δ − 1, with −Δ clipped to ±20 and the
    result to [−10, 10] (verl).

  A trailing '+' (e.g. 'k3+') keeps the value of the estimator but takes
  the gradient of k2, which is unbiased for the KL gradient (straight-through).

  Args:
    logprobs: [B, T] log π of the sampled tokens.
    ref_logprobs: [B, T] log π_ref of the same tokens.
    estimator: 'k1' | 'k2' | 'k3' | 'abs' (aliases 'kl', 'mse',
      'low_var_kl'), optionally with a '+' suffix.

  Returns:
    [B, T] KL estimates (mask them downstream).
  """
  fn = "kl_divergence"
  if not isinstance(estimator, str):
    raise ValueError(f"{fn}: `estimator` must be a string, got {estimator!r}.")
  straight_through = estimator.endswith("+")
  base = estimator[:-1] if straight_through else estimator
  _checks.check_choice(base, tuple(_KL_ALIASES), "estimator", fn)
  base = _KL_ALIASES[base]
  logprobs = _checks.as_float(logprobs, "logprobs", fn)
  ref = _checks.as_float(ref_logprobs, "ref_logprobs", fn)
  _checks.check_same_shape([logprobs, ref], ["logprobs", "ref_logprobs"], fn)
  delta = logprobs - ref
  if base == "k1":
    value = delta
  elif base == "abs":
    value = jnp.abs(delta)
  elif base == "k2":
    value = 0.5 * jnp.square(delta)
  else:
    neg = jnp.clip(-delta, -20.0, 20.0)
    value = jnp.clip(jnp.exp(neg) - neg - 1, -10.0, 10.0)
  if not straight_through or base == "k2":
    return value
  surrogate = 0.5 * jnp.square(delta)
  return surrogate - jax.lax.stop_gradient(surrogate) + (
      jax.lax.stop_gradient(value))


def aggregate_loss(loss, mask, *, mode: str = "token-mean",
                   scale: Optional[float] = None, axis_name=None):
  """Reduces a [B, T] token loss to a scalar.

    token-mean:              Σ ℓ·m / Σ m
    seq-mean-token-sum:      mean over non-empty rows of Σ_t ℓ·m
    seq-mean-token-mean:     mean over non-empty rows of Σ_t ℓ·m / Σ_t m
    seq-mean-token-sum-norm: Σ ℓ·m / scale   (scale defaults to T; Dr. GRPO)

  Rows without valid tokens are left out of the sequence means; an empty
  batch gives 0. Note on 'seq-mean-token-sum-norm': this follows verl at
  b178a3c; verl 0.9 additionally divides by the number of non-empty rows,
  and tunix's similarly named mode divides by the batch size.

  Args:
    loss: [B, T] token losses.
    mask: [B, T] loss mask.
    mode: one of `LOSS_AGG_MODES`.
    scale: constant for 'seq-mean-token-sum-norm' (default T).
    axis_name: `shard_map` axis name; counts and sums are global, or None.

  Returns:
    Scalar loss.
  """
  fn = "aggregate_loss"
  _checks.check_choice(mode, LOSS_AGG_MODES, "mode", fn)
  loss = _checks.as_float(loss, "loss", fn)
  mask = _checks.as_mask(mask, "mask", fn)
  _checks.check_rank(loss, 2, "loss", fn, "[B, T]")
  _checks.check_same_shape([loss, mask], ["loss", "mask"], fn)
  if mode == "token-mean":
    return masking.masked_mean(loss, mask, axis_name=axis_name)
  row_sums = jnp.sum(jnp.where(mask, loss, 0), axis=1)
  if mode == "seq-mean-token-sum-norm":
    total = masking.masked_sum(row_sums, True, axis_name=axis_name)
    return total / (loss.shape[1] if scale is None else scale)
  counts = jnp.sum(mask, axis=1, dtype=loss.dtype)
  if mode == "seq-mean-token-mean":
    row_sums = row_sums / jnp.maximum(counts, 1)
  return masking.masked_mean(row_sums, counts > 0, axis_name=axis_name)


def clipped_surrogate_loss(ratio, advantages, *, clip_low: float = 0.2,
                           clip_high: Optional[float] = None,
                           dual_clip: Optional[float] = None):
  """PPO's clipped surrogate per token (minimised), with dual and DAPO clip.

    ℓ = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high));
    dual clip (A < 0): ℓ = min(ℓ, −A·c),  c > 1.

  Args:
    ratio: [B, T] importance ratios ρ = π/π_old.
    advantages: [B, T] advantages.
    clip_low: ε_low.
    clip_high: ε_high (DAPO "clip-higher", e.g. 0.28); defaults to ε_low.
    dual_clip: c for dual-clip PPO (verl uses 3.0), or None.

  Returns:
    [B, T] token losses.
  """
  fn = "clipped_surrogate_loss"
  clip_high = clip_low if clip_high is None else clip_high
  if dual_clip is not None and not dual_clip > 1:
    raise ValueError(f"{fn}: `dual_clip` must be > 1, got {dual_clip}.")
  ratio = _checks.as_float(ratio, "ratio", fn)
  adv = _checks.as_float(advantages, "advantages", fn)
  _checks.check_same_shape([ratio, adv], ["ratio", "advantages"], fn)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1 - clip_low, 1 + clip_high)
  loss = jnp.maximum(unclipped, clipped)
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
  return loss


def policy_loss(logprobs, old_logprobs, advantages, response_mask, *,
                clip_low: float = 0.2, clip_high: Optional[float] = None,
                dual_clip: Optional[float] = None,
                loss_agg_mode: str = "token-mean",
                loss_scale: Optional[float] = None, axis_name=None):
  """PPO-clip policy loss aggregated over valid tokens (verl 'vanilla').

    log ρ = clip(log π − log π_old, −20, 20);  ℓ = clipped_surrogate_loss.

  Args:
    logprobs: [B, T] log π_θ of the sampled tokens.
    old_logprobs: [B, T] log π_old (rollout policy).
    advantages: [B, T] advantages.
    response_mask: [B, T] response mask.
    clip_low, clip_high, dual_clip: see `clipped_surrogate_loss`.
    loss_agg_mode: see `aggregate_loss`.
    loss_scale: scale for 'seq-mean-token-sum-norm'.
    axis_name: `shard_map` axis name, or None.

  Returns:
    (loss scalar, metrics dict: 'clipfrac' (fraction of tokens where the
    clipped term is active), 'ppo_kl' (mean of −log ρ)).
  """
  fn = "policy_loss"
  logprobs = _checks.as_float(logprobs, "logprobs", fn)
  old = _checks.as_float(old_logprobs, "old_logprobs", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_same_shape([logprobs, old, mask],
                           ["logprobs", "old_logprobs", "response_mask"], fn)
  log_ratio = jnp.clip(logprobs - old, -20.0, 20.0)
  ratio = jnp.exp(log_ratio)
  adv = _checks.as_float(advantages, "advantages", fn)
  token_loss = clipped_surrogate_loss(ratio, adv, clip_low=clip_low,
                                      clip_high=clip_high,
                                      dual_clip=dual_clip)
  clip_high = clip_low if clip_high is None else clip_high
  clipped = -adv * jnp.clip(ratio, 1 - clip_low, 1 + clip_high)
  loss = aggregate_loss(token_loss, mask, mode=loss_agg_mode,
                        scale=loss_scale, axis_name=axis_name)
  metrics = {
      "clipfrac": masking.masked_mean(
          (clipped > -adv * ratio).astype(jnp.float32), mask,
          axis_name=axis_name),
      "ppo_kl": masking.masked_mean(-log_ratio, mask, axis_name=axis_name),
  }
  return loss, metrics


def value_loss(values, old_values, returns, response_mask, *,
               clip_range: Optional[float] = 0.5,
               loss_agg_mode: str = "token-mean",
               loss_scale: Optional[float] = None, axis_name=None):
  """PPO's clipped value loss (verl `compute_value_loss`).

    V^clip = clip(V, V_old − c, V_old + c);
    L = ½·agg(max((V − G)², (V^clip − G)²)).

  Args:
    values: [B, T] current value predictions V.
    old_values: [B, T] values at rollout time V_old.
    returns: [B, T] targets G (e.g. from `gae`).
    response_mask: [B, T] response mask.
    clip_range: c (`cliprange_value`, 0.5 in verl); None disables clipping.
    loss_agg_mode: see `aggregate_loss`.
    loss_scale: scale for 'seq-mean-token-sum-norm'.
    axis_name: `shard_map` axis name, or None.

  Returns:
    (loss scalar, clipfrac scalar: fraction of tokens where the clipped
    error is the larger one).
  """
  fn = "value_loss"
  values = _checks.as_float(values, "values", fn)
  old = _checks.as_float(old_values, "old_values", fn)
  targets = _checks.as_float(returns, "returns", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_same_shape([values, old, targets, mask],
                           ["values", "old_values", "returns",
                            "response_mask"], fn)
  unclipped = jnp.square(values - targets)
  if clip_range is None:
    clipped = unclipped
  else:
    clipped = jnp.square(
        jnp.clip(values, old - clip_range, old + clip_range) - targets)
  loss = 0.5 * aggregate_loss(jnp.maximum(unclipped, clipped), mask,
                              mode=loss_agg_mode, scale=loss_scale,
                              axis_name=axis_name)
  clipfrac = masking.masked_mean((clipped > unclipped).astype(jnp.float32),
                                 mask, axis_name=axis_name)
  return loss, clipfrac


def _present_rows(response_mask, fn):
  """[B] bool: rows with at least one valid token (the others are absent)."""
  return jnp.any(_checks.as_mask(response_mask, "response_mask", fn), axis=1)


def _sequence_log_ratio(log_ratios, response_mask, fn):
  x = _checks.as_float(log_ratios, "log_ratios", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_rank(x, 2, "log_ratios", fn, "[B, T]")
  _checks.check_same_shape([x, mask], ["log_ratios", "response_mask"], fn)
  return jnp.sum(jnp.where(mask, x, 0), axis=1)


def implicit_prm_ce_row_losses(log_ratios, response_mask, labels, *,
                               beta: float):
  """Per-row cross-entropy of an implicit PRM on outcome labels (PRIME).

    z_i = β·Σ_t log-ratio_{i,t}·m_{i,t};
    ℓ_i = −[ y_i·log σ(z_i) + (1 − y_i)·log σ(−z_i) ]   if Σ_t m_{i,t} > 0,
    ℓ_i = 0                                              otherwise.

  A row with an all-zero mask is absent (a row the accuracy filter removed):
  without the guard it would hold z = 0, i.e. ℓ = log 2.

  Args:
    log_ratios: [B, T] log π_φ − log π_ref per token.
    response_mask: [B, T] response mask.
    labels: [B] outcome labels y ∈ [0, 1].
    beta: β (0.05 in PRIME).

  Returns:
    [B] row losses.
  """
  fn = "implicit_prm_ce_row_losses"
  z = beta * _sequence_log_ratio(log_ratios, response_mask, fn)
  y = _checks.as_float(labels, "labels", fn)
  _checks.check_same_shape([z, y], ["log_ratios[:, 0]", "labels"], fn)
  present = _present_rows(response_mask, fn)
  ce = -(y * jax.nn.log_sigmoid(z) + (1 - y) * jax.nn.log_sigmoid(-z))
  return jnp.where(present, ce, 0)


def implicit_prm_ce_loss(log_ratios, response_mask, labels, *, beta: float):
  """Cross-entropy loss of an implicit PRM on outcome labels (PRIME).

    L = Σ_i ℓ_i / #{i : Σ_t m_{i,t} > 0}   (`implicit_prm_ce_row_losses`):

  the mean over the rows that have a response. Rows with an all-zero mask
  (filtered out) neither add to the loss nor scale its gradient, as if they
  were not in the batch (PRIME drops them); if there are none, L = 0.
  Arguments as in `implicit_prm_ce_row_losses`; returns a scalar.
  """
  rows = implicit_prm_ce_row_losses(log_ratios, response_mask, labels,
                                    beta=beta)
  return masking.masked_mean(
      rows, _present_rows(response_mask, "implicit_prm_ce_loss"))


def implicit_prm_dpo_loss(log_ratios, response_mask, labels,
                          group_size: int, *, beta: float, axis_name=None):
  """PRIME's group DPO loss for an implicit PRM ("detach dpo").

    Q_i = β·Σ_t log-ratio_{i,t};  for a correct sample (y_i > 0) the
    opponents are the group members with lower y, otherwise those with
    higher y; Q̄_i = their mean Q (gradient stopped), 0 if there are none;
    L = mean_i −log σ((Q_i − Q̄_i)·(2·1[y_i > 0] − 1)).

  Args:
    log_ratios: [B, T] per-token log-ratios.
    response_mask: [B, T] response mask.
    labels: [B] outcome labels (accuracy).
    group_size: static n.
    beta: β.
    axis_name: `shard_map` axis name (peers may live on other devices; the
      mean is global), or None.

  Returns:
    Scalar loss.
  """
  fn = "implicit_prm_dpo_loss"
  q = beta * _sequence_log_ratio(log_ratios, response_mask, fn)
  y = _checks.as_float(labels, "labels", fn)
  _checks.check_same_shape([q, y], ["log_ratios[:, 0]", "labels"], fn)
  if axis_name is not None:
    q_all = jax.lax.all_gather(q, axis_name, tiled=True)
    y_all = jax.lax.all_gather(y, axis_name, tiled=True)
    offset = jax.lax.axis_index(axis_name) * q.shape[0]
  else:
    q_all, y_all, offset = q, y, 0
  n = _checks.check_group_size(q_all.shape[0], group_size, fn)
  rows = offset + jnp.arange(q.shape[0])
  members = (rows // n * n)[:, None] + jnp.arange(n)[None, :]
  peer_q = jax.lax.stop_gradient(q_all[members])
  peer_y = y_all[members]
  opponents = jnp.where((y > 0)[:, None], peer_y < y[:, None],
                        peer_y > y[:, None])
  count = jnp.sum(opponents, axis=1)
  mean_q = jnp.sum(jnp.where(opponents, peer_q, 0), axis=1) / jnp.maximum(
      count, 1)
  sign = jnp.where(y > 0, 1.0, -1.0)
  loss = -jnp.mean(jax.nn.log_sigmoid((q - mean_q) * sign))
  return loss if axis_name is None else jax.lax.pmean(loss, axis_name)


def implicit_prm_group_accuracies(log_ratios, response_mask, labels,
                                  group_size: int):
  """PRIME's `compute_dpo_accuracy` per group: ranking accuracy, [B // n].

  Pairs (i, j) of a group are weighted by |y_i − y_j|; a pair is right when
  sign(Q_i − Q_j) agrees with sign(y_i − y_j) (ties in Q count as "not
  greater"), with Q_i = Σ_t log-ratio_{i,t}·m_{i,t}. Rows with an all-zero
  mask are absent and form no pair. A group without a weighted pair (all
  labels equal) scores 0.5.

  Args:
    log_ratios: [B, T] per-token log-ratios.
    response_mask: [B, T] response mask.
    labels: [B] outcome labels.
    group_size: static n.

  Returns:
    [B // n] accuracies in [0, 1].
  """
  fn = "implicit_prm_group_accuracies"
  q = _sequence_log_ratio(log_ratios, response_mask, fn)
  y = _checks.as_float(labels, "labels", fn)
  n = _checks.check_group_size(q.shape[0], group_size, fn)
  present = _present_rows(response_mask, fn).reshape(-1, n)
  q = q.reshape(-1, n)
  y = y.reshape(-1, n)
  dq = q[:, :, None] - q[:, None, :]
  dy = y[:, :, None] - y[:, None, :]
  upper = jnp.triu(jnp.ones((n, n), bool), k=1)
  pairs = upper[None] & present[:, :, None] & present[:, None, :]
  weight = jnp.where(pairs, jnp.abs(dy), 0)
  right = ((dq > 0) == (dy > 0)).astype(q.dtype)
  total = jnp.sum(weight, axis=(1, 2))
  acc = jnp.sum(right * weight, axis=(1, 2)) / jnp.where(total > 0, total, 1)
  return jnp.where(total > 0, acc, 0.5)


def implicit_prm_pairwise_accuracy(log_ratios, response_mask, labels,
                                   group_size: int):
  """PRIME's `compute_dpo_accuracy`: ranking accuracy within groups.

  The mean of `implicit_prm_group_accuracies` over the groups that have at
  least one row with a response (groups the accuracy filter removed are
  left out); 0 if there is none. Arguments as there; returns a scalar.
  """
  acc = implicit_prm_group_accuracies(log_ratios, response_mask, labels,
                                      group_size)
  present = _present_rows(response_mask, "implicit_prm_pairwise_accuracy")
  return masking.masked_mean(
      acc, jnp.any(present.reshape(acc.shape[0], -1), axis=1))
