"""Outcome and group baselines: GRPO, Dr. GRPO, RLOO, REINFORCE++, GRPO
with process supervision, and step-by-step PPO with PRM step rewards.

Groups: the n = `group_size` samples of a prompt are contiguous in the batch,
so group statistics are a reshape of [B] to [B // n, n]; B % n == 0 is
checked at trace time. Inside `jax.shard_map`, pass the batch axis as
`axis_name`: each device then holds a slice of the global batch (device d
holds global rows d·B_local … (d+1)·B_local − 1) and group sums, maxima and
minima are all-reduced, so a group may even be split across devices.

A sample with no peers (group_size = 1) gets baseline 0 and scale 1 under
every estimator — verl's convention (tunix's RLOO gives 0 instead).
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import masking
from rl_rewards.core import returns as returns_lib
from rl_rewards.core import segments

_ESTIMATORS = ("grpo", "drgrpo", "rloo")
_REDUCE_OPS = {
    "sum": (jax.ops.segment_sum, jax.lax.psum),
    "max": (jax.ops.segment_max, jax.lax.pmax),
    "min": (jax.ops.segment_min, jax.lax.pmin),
}


def _group_reduce(x, group_size, op, axis_name):
  """Reduces x [B, ...] over each group; returns it broadcast back to [B]."""
  batch = x.shape[0]
  if axis_name is None:
    grouped = x.reshape((batch // group_size, group_size) + x.shape[1:])
    reduced = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[op](
        grouped, axis=1, keepdims=True)
    return jnp.broadcast_to(reduced, grouped.shape).reshape(x.shape)
  segment_op, all_reduce = _REDUCE_OPS[op]
  num_groups = batch * jax.lax.axis_size(axis_name) // group_size
  global_row = jax.lax.axis_index(axis_name) * batch + jnp.arange(batch)
  group_id = global_row // group_size
  reduced = all_reduce(segment_op(x, group_id, num_segments=num_groups),
                       axis_name)
  return reduced[group_id]


def group_reduce(x, group_size: int, op: str = "sum", *,
                 axis_name=None) -> jnp.ndarray:
  """Reduces per-sample values over each group, broadcast back per sample.

    y_i = Σ_{j∈g(i)} x_j  (or max / min over the group).

  Args:
    x: [B] or [B, ...] per-sample values, groups contiguous.
    group_size: static n; must divide the (global) batch.
    op: 'sum', 'max' or 'min'.
    axis_name: `shard_map` axis name (all-reduces across devices), or None.

  Returns:
    Array shaped like `x`.
  """
  fn = "group_reduce"
  _checks.check_choice(op, tuple(_REDUCE_OPS), "op", fn)
  x = jnp.asarray(x)
  if x.ndim < 1:
    raise ValueError(f"{fn}: `x` must have a batch axis, got a scalar.")
  batch = x.shape[0] * (
      1 if axis_name is None else jax.lax.axis_size(axis_name))
  n = _checks.check_group_size(batch, group_size, fn)
  return _group_reduce(x, n, op, axis_name)


def _check_scores(scores, group_size, fn, axis_name):
  scores = _checks.as_float(scores, "scores", fn)
  _checks.check_rank(scores, 1, "scores", fn, "[B]")
  batch = scores.shape[0]
  if axis_name is not None:
    batch *= jax.lax.axis_size(axis_name)
  group_size = _checks.check_group_size(batch, group_size, fn)
  return scores, group_size


def group_statistics(scores, group_size: int, *, std_ddof: int = 1,
                     axis_name=None):
  """Per-sample group mean and standard deviation, broadcast to [B].

    μ_g = (1/n) Σ_{i∈g} s_i,   σ_g = sqrt(Σ_{i∈g} (s_i − μ_g)² / (n − ddof)).

  For n = 1 this returns μ = 0 and σ = 1 (verl); for n − ddof ≤ 0 with
  n > 1 (ddof ≥ n) σ = 0.

  Args:
    scores: [B] scores, groups contiguous.
    group_size: static n; must divide the (global) batch.
    std_ddof: 1 for the unbiased std (verl/tunix GRPO), 0 for population.
    axis_name: `shard_map` axis name, or None.

  Returns:
    (mean [B], std [B]).
  """
  scores, n = _check_scores(scores, group_size, "group_statistics", axis_name)
  if n == 1:
    return jnp.zeros_like(scores), jnp.ones_like(scores)
  mean = _group_reduce(scores, n, "sum", axis_name) / n
  squares = _group_reduce(jnp.square(scores - mean), n, "sum", axis_name)
  dof = n - std_ddof
  std = jnp.sqrt(squares / dof) if dof > 0 else jnp.zeros_like(scores)
  return mean, std


def group_advantages(scores, group_size: int, *, estimator: str,
                     eps: float = 1e-6, std_ddof: int = 1,
                     axis_name=None) -> jnp.ndarray:
  """Outcome advantages relative to the other samples of the same prompt.

    grpo:   A_i = (s_i − μ_g) / (σ_g + eps),  σ_g the unbiased group std.
    drgrpo: A_i = s_i − μ_g                    (Dr. GRPO: no std scaling).
    rloo:   A_i = s_i − (1/(n−1)) Σ_{j∈g, j≠i} s_j.

  Groups whose scores are all equal give exactly 0 (no rounding noise
  divided by eps). Group of one: grpo gives s/(1 + eps), drgrpo and rloo
  give s (baseline 0, as verl). Broadcast to tokens with
  `broadcast_to_tokens(A, response_mask)`.

  Args:
    scores: [B] sequence scores (e.g. verifier rewards), groups contiguous.
    group_size: static n; B (globally) must be divisible by it.
    estimator: 'grpo', 'drgrpo' or 'rloo'.
    eps: added to σ for 'grpo'.
    std_ddof: 1 (unbiased, default) or 0 (population std) for 'grpo'.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B] advantages.
  """
  fn = "group_advantages"
  _checks.check_choice(estimator, _ESTIMATORS, "estimator", fn)
  scores, n = _check_scores(scores, group_size, fn, axis_name)
  if n == 1:
    return scores / (1 + eps) if estimator == "grpo" else scores
  total = _group_reduce(scores, n, "sum", axis_name)
  spread = (_group_reduce(scores, n, "max", axis_name)
            - _group_reduce(scores, n, "min", axis_name))
  if estimator == "rloo":
    adv = scores - (total - scores) / (n - 1)
  else:
    mean = total / n
    adv = scores - mean
    if estimator == "grpo":
      _, std = group_statistics(scores, n, std_ddof=std_ddof,
                                axis_name=axis_name)
      adv = adv / (std + eps)
  return jnp.where(spread > 0, adv, 0)


def reinforce_plus_plus(token_rewards, response_mask, *, gamma=1.0,
                        axis_name=None):
  """REINFORCE++: discounted returns whitened over the whole batch.

    G_t = r_t + γ·G_{t+1}, reset at every invalid token (verl's loop:
          a hole inside a row ends the return; `discounted_returns`),
    A = masked_whiten(G) · m   (unbiased variance, batch-global).

  Token rewards usually hold the outcome on the last valid token minus
  β·KL on every token (see `kl_divergence`).

  Args:
    token_rewards: [B, T] token rewards.
    response_mask: [B, T] response mask.
    gamma: discount γ.
    axis_name: `shard_map` axis name for the whitening statistics, or None.

  Returns:
    (advantages [B, T], returns [B, T]).
  """
  returns = returns_lib.discounted_returns(token_rewards, response_mask,
                                           gamma=gamma)
  advantages = masking.masked_whiten(returns, response_mask,
                                     axis_name=axis_name)
  return advantages, returns


def reinforce_plus_plus_baseline(scores, response_mask, group_size: int, *,
                                 axis_name=None):
  """REINFORCE++ with a group baseline (verl `reinforce_plus_plus_baseline`).

    a_i = s_i − μ_g (μ = 0 for a group of one), tiled over the valid tokens,
    then whitened over all valid tokens of the batch (token-weighted: long
    responses weigh more in the statistics).

  Args:
    scores: [B] sequence scores, groups contiguous.
    response_mask: [B, T] response mask.
    group_size: static n.
    axis_name: `shard_map` axis name, or None.

  Returns:
    (advantages [B, T], returns [B, T]) — equal, as in verl.
  """
  centred = group_advantages(scores, group_size, estimator="drgrpo",
                             axis_name=axis_name)
  tiled = segments.broadcast_to_tokens(centred, response_mask)
  advantages = masking.masked_whiten(tiled, response_mask,
                                     axis_name=axis_name)
  return advantages, advantages


def grpo_process_advantages(step_rewards, step_mask, step_ids,
                            group_size: int, *, eps: float = 1e-6,
                            std_ddof: int = 1, axis_name=None):
  """GRPO with process supervision (DeepSeekMath §4.1.3).

    r̃_{i,j} = (r_{i,j} − mean(R_g)) / (std(R_g) + eps),  R_g = all valid step
    rewards of all samples of the prompt;
    A_{i,t} = Σ_{j: e_{i,j} ≥ t} r̃_{i,j}  (sum over the current and later
    steps, γ = 1), the same for every token of a step.

  This is the sum-form return that min-form credit assignment argues against;
  it is the canonical "step rewards into a group estimator" baseline.

  Args:
    step_rewards: [B, S] step rewards (e.g. PRM scores).
    step_mask: [B, S] step mask.
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    group_size: static n.
    eps: added to the std.
    std_ddof: 1 (unbiased) or 0.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B, T] token advantages, 0 on invalid tokens.
  """
  fn = "grpo_process_advantages"
  rewards = _checks.as_float(step_rewards, "step_rewards", fn)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_rank(rewards, 2, "step_rewards", fn, "[B, S]")
  _checks.check_same_shape([rewards, mask], ["step_rewards", "step_mask"],
                           fn)
  batch = rewards.shape[0]
  if axis_name is not None:
    batch *= jax.lax.axis_size(axis_name)
  n = _checks.check_group_size(batch, group_size, fn)
  values = jnp.where(mask, rewards, 0)
  counts = _group_reduce(jnp.sum(mask, axis=1, dtype=values.dtype), n, "sum",
                         axis_name)
  mean = _safe_div(_group_reduce(jnp.sum(values, axis=1), n, "sum",
                                 axis_name), counts)
  centred = jnp.where(mask, values - mean[:, None], 0)
  squares = _group_reduce(jnp.sum(jnp.square(centred), axis=1), n, "sum",
                          axis_name)
  std = jnp.sqrt(_safe_div(squares, counts - std_ddof))
  normalised = centred / (std[:, None] + eps)
  step_advantages = returns_lib.step_returns(normalised, mask, gamma=1.0)
  return segments.steps_to_tokens(step_advantages, step_ids)


def _safe_div(numerator, denominator):
  safe = jnp.where(denominator > 0, denominator, 1)
  return jnp.where(denominator > 0, numerator / safe, 0)


def process_token_rewards(step_rewards, step_ids, response_mask,
                          outcome_scores=None, *, outcome_coef=1.0,
                          extra_token_rewards=None) -> jnp.ndarray:
  """Dense token rewards of step-by-step PPO (Math-Shepherd, arXiv
  2312.08935; Let's Reinforce Step by Step, arXiv 2311.05821).

    R_{b,t} = Σ_k r_{b,k}·1[t = e_{b,k}] + c·s_b·1[t = t_b^last] + x_{b,t},

  each PRM step reward on its step's last token, the outcome (if any) on
  the last valid token — which is also the final step's end, so the two
  add there — and extra per-token terms (e.g. −β·KL). Only valid tokens
  carry rewards; step ids off the response are ignored.

  Args:
    step_rewards: [B, S] PRM step rewards r_k (invalid steps ignored).
    step_ids: [B, T] int step ids, −1 off the response.
    response_mask: [B, T] response mask.
    outcome_scores: optional [B] verifier outcome s_b.
    outcome_coef: c.
    extra_token_rewards: optional [B, T] added on valid tokens.

  Returns:
    [B, T] token rewards, 0 on invalid tokens.
  """
  fn = "process_token_rewards"
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(mask, 2, "response_mask", fn, "[B, T]")
  _checks.check_same_shape([ids, mask], ["step_ids", "response_mask"], fn)
  ids = jnp.where(mask, ids, -1)
  rewards = segments.steps_to_end_tokens(step_rewards, ids)
  if outcome_scores is not None:
    rewards = rewards + outcome_coef * segments.outcome_token_rewards(
        outcome_scores, mask)
  if extra_token_rewards is not None:
    extra = _checks.as_float(extra_token_rewards, "extra_token_rewards", fn)
    _checks.check_same_shape([extra, mask],
                             ["extra_token_rewards", "response_mask"], fn)
    rewards = rewards + extra
  return jnp.where(mask, rewards, 0)


def process_ppo_advantages(step_rewards, step_ids, response_mask, values, *,
                           gamma, lam, outcome_scores=None, outcome_coef=1.0,
                           extra_token_rewards=None):
  """PPO with PRM step rewards: `process_token_rewards`, then token GAE.

    δ_t = R_t + γ·V_{t'} − V_t,   A_t = δ_t + γλ·A_{t'}   (`returns.gae`).

  Raw advantages; whiten with `masking.masked_whiten` as verl does.

  Args:
    step_rewards: [B, S] PRM step rewards.
    step_ids: [B, T] int step ids.
    response_mask: [B, T] response mask.
    values: [B, T] critic values V_t.
    gamma: γ.
    lam: GAE λ.
    outcome_scores: optional [B] outcome on the last token.
    outcome_coef: weight of the outcome.
    extra_token_rewards: optional [B, T] (e.g. −β·KL).

  Returns:
    (advantages [B, T], returns [B, T]).
  """
  rewards = process_token_rewards(
      step_rewards, step_ids, response_mask, outcome_scores,
      outcome_coef=outcome_coef, extra_token_rewards=extra_token_rewards)
  return returns_lib.gae(rewards, values, response_mask, gamma=gamma,
                         lam=lam)
