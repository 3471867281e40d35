"""PURE: min-form credit assignment with a token-level RLOO baseline.

Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All Process
Reward Model Needs for Reasoning" (arXiv 2504.15275); semantics follow the
reference code (OpenRLHF branch). The pipeline, each step a function here:

1. `softmin_step_rewards`: r*_k = softmax_k(−r/T)·r_k, so that the plain
   γ = 1 sum of r* approximates the minimum step reward (T → 0: exact);
   or the hard min-form, `min_form_step_rewards`: r*_k = G_k − G_{k+1}
   with G the min-form returns (`returns.min_form_returns`, both forms),
   so that the γ = 1 return of every step is exactly its min-form return.
2. `pure_rloo_step_rewards`: subtract the leave-one-out baseline of the other
   samples of the prompt, per token ("token", default) or per step ("step",
   abandoned by the authors because it rewards emitting fewer steps).
3. Put the adjusted rewards on step-end tokens, add the verifiable reward
   (RLOO of solved − 1) at the last token, take γ = 1 returns.
4. `mask_step_end_tokens`: returns on step-end tokens (delimiters and EOS)
   are set to 0 — these tokens get no policy gradient.
5. `pure_normalize`: PURE's replay-buffer normalisation over nonzero entries.

`pure_advantages` runs the whole pipeline.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib
from rl_rewards.core import returns as returns_lib
from rl_rewards.core import segments

_BASELINES = ("token", "step")


def softmin_step_rewards(step_rewards, step_mask, temperature) -> jnp.ndarray:
  """PURE's min-form transform of step rewards.

    r*_k = w_k · r_k,   w_k = exp(−r_k/T) / Σ_{j valid} exp(−r_j/T),

  a softmax over *all* valid steps of the response (invalid steps get logit
  −∞). Σ_k r*_k → min_k r_k as T → 0; tied minima share the weight. Rows
  without valid steps give zeros.

  Args:
    step_rewards: [B, S] step rewards r_k (PRM p(+) − p(−) ∈ [−1, 1]).
    step_mask: [B, S] step mask.
    temperature: T > 0 (PURE default 0.1).

  Returns:
    [B, S] transformed rewards r*_k, 0 on invalid steps.
  """
  fn = "softmin_step_rewards"
  _checks.check_positive(temperature, "temperature", fn)
  rewards = _checks.as_float(step_rewards, "step_rewards", fn)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_rank(rewards, 2, "step_rewards", fn, "[B, S]")
  _checks.check_same_shape([rewards, mask], ["step_rewards", "step_mask"], fn)
  logits = jnp.where(mask, -rewards / temperature, -jnp.inf)
  peak = jnp.max(logits, axis=1, keepdims=True)
  peak = jnp.where(jnp.isfinite(peak), peak, 0)
  unnormalised = jnp.where(mask, jnp.exp(logits - peak), 0)
  total = jnp.sum(unnormalised, axis=1, keepdims=True)
  weights = unnormalised / jnp.where(total > 0, total, 1)
  return jnp.where(mask, weights * rewards, 0)


def min_form_step_rewards(step_rewards, step_mask, *,
                          form: str = "running_min") -> jnp.ndarray:
  """Step rewards whose γ = 1 returns are the min-form returns.

    G = min_form_returns(r, form)  (running_min: G_k = min_{j ≥ k} r_j;
                                    paper: the same up to the first argmin,
                                    0 after it — PURE §3.1),
    r*_k = G_k − G_{k+1} (G_{S} = 0),  so Σ_{j ≥ k} r*_j = G_k.

  Args:
    step_rewards: [B, S] step rewards r_k.
    step_mask: [B, S] step mask (valid steps a prefix).
    form: 'running_min' or 'paper' (see `returns.min_form_returns`).

  Returns:
    [B, S] rewards r*, 0 on invalid steps.
  """
  mask = _checks.as_mask(step_mask, "step_mask", "min_form_step_rewards")
  returns = returns_lib.min_form_returns(step_rewards, mask, form=form)
  following = jnp.pad(returns[:, 1:], ((0, 0), (0, 1)))
  return jnp.where(mask, returns - following, 0)


def pure_rloo_step_rewards(step_rewards, step_ids, response_mask,
                           group_size: int, *, baseline: str = "token",
                           axis_name=None) -> jnp.ndarray:
  """Subtracts PURE's leave-one-out baseline from (transformed) step rewards.

    O_i = Σ_k r*_{i,k},  L_i = response length,  ℓ_{i,k} = tokens of step k
    excluding its delimiter/EOS token.
    token (default): r*_{i,k} − b_i·ℓ_{i,k},  b_i = Σ_{j≠i} O_j / Σ_{j≠i} L_j.
    step:            r*_{i,k} − mean_{j≠i}(O_j / K_j).

  A group of one gets baseline 0.

  Args:
    step_rewards: [B, S] transformed step rewards r* (0 on invalid steps).
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    response_mask: [B, T] response mask.
    group_size: static n.
    baseline: 'token' or 'step'.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B, S] adjusted step rewards, 0 on invalid steps.
  """
  fn = "pure_rloo_step_rewards"
  _checks.check_choice(baseline, _BASELINES, "baseline", fn)
  rewards = _checks.as_float(step_rewards, "step_rewards", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(rewards, 2, "step_rewards", fn, "[B, S]")
  _checks.check_same_shape([ids, mask], ["step_ids", "response_mask"], fn)
  _checks.check_batch(ids, rewards.shape[0], "step_ids", fn)
  num_steps = rewards.shape[1]
  step_mask = segments.step_mask_from_ids(ids, num_steps)
  rewards = jnp.where(step_mask, rewards, 0)
  batch = rewards.shape[0] * (
      1 if axis_name is None else jax.lax.axis_size(axis_name))
  n = _checks.check_group_size(batch, group_size, fn)
  totals = jnp.sum(rewards, axis=1)

  def others(x):  # Σ_{j≠i} x_j within the group.
    return advantages_lib.group_reduce(x, n, axis_name=axis_name) - x

  if baseline == "token":
    lengths = jnp.sum(mask, axis=1, dtype=rewards.dtype)
    other_lengths = others(lengths)
    per_token = jnp.where(other_lengths > 0, others(totals)
                          / jnp.where(other_lengths > 0, other_lengths, 1), 0)
    content = jnp.maximum(segments.step_token_counts(ids, num_steps) - 1, 0)
    adjusted = rewards - per_token[:, None] * content
  else:
    num_valid = jnp.sum(step_mask, axis=1, dtype=rewards.dtype)
    per_step = jnp.where(num_valid > 0,
                         totals / jnp.where(num_valid > 0, num_valid, 1), 0)
    mean_others = others(per_step) / max(n - 1, 1)
    adjusted = rewards - mean_others[:, None]
  return jnp.where(step_mask, adjusted, 0)


def mask_step_end_tokens(token_values, step_ids,
                         step_end_mask=None) -> jnp.ndarray:
  """Zeros the values on step-end tokens (delimiters and the final token).

  PURE gives these tokens no advantage unless `--nomask_separator_adv`.

  Args:
    token_values: [B, T] token values (e.g. returns).
    step_ids: [B, T] int step ids.
    step_end_mask: optional [B, T] bool step ends; default: the ends of
      `step_ids`. Pass the ends of the unclamped steps when later steps were
      merged into the last slot: its inner delimiters are ends too.

  Returns:
    [B, T] values with step ends set to 0.
  """
  values = _checks.as_float(token_values, "token_values",
                            "mask_step_end_tokens")
  if step_end_mask is None:
    step_end_mask = segments.step_end_mask_from_ids(step_ids)
  return jnp.where(jnp.asarray(step_end_mask, bool), 0, values)


def pure_normalize(advantages, response_mask, *, axis_name=None):
  """PURE's replay-buffer normalisation, which leaves zeros at zero.

    N = #{valid t : A_t ≠ 0},  μ = Σ_valid A / N,
    σ² = max(Σ_valid (A − μ)² / N, 1e-8)   (numerator over *all* valid
    tokens, zeros included; denominator only the nonzero ones),
    Â_t = (A_t − μ)/σ where A_t ≠ 0, and 0 elsewhere.

  Args:
    advantages: [B, T] advantages with step ends already zeroed.
    response_mask: [B, T] response mask.
    axis_name: `shard_map` axis name (PURE all-reduces these sums), or None.

  Returns:
    [B, T] normalised advantages.
  """
  fn = "pure_normalize"
  x = _checks.as_float(advantages, "advantages", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_same_shape([x, mask], ["advantages", "response_mask"], fn)
  x = jnp.where(mask, x, 0)
  nonzero = mask & (x != 0)

  def total(v):
    s = jnp.sum(v)
    return s if axis_name is None else jax.lax.psum(s, axis_name)

  count = total(nonzero.astype(x.dtype))
  safe_count = jnp.where(count > 0, count, 1)
  mean = total(x) / safe_count
  var = total(jnp.where(mask, jnp.square(x - mean), 0)) / safe_count
  normalised = (x - mean) * jax.lax.rsqrt(jnp.maximum(var, 1e-8))
  return jnp.where(nonzero, normalised, 0)


def pure_advantages(step_rewards, step_ids, response_mask, group_size: int,
                    *, temperature: Optional[float] = 0.1,
                    solved=None, verifiable_coef: float = 1.0,
                    extra_token_rewards=None, baseline: str = "token",
                    mask_step_ends: bool = True, normalize: bool = True,
                    step_end_mask=None, axis_name=None):
  """The PURE advantage pipeline (PRM, or PRM + verifiable reward).

    r* = softmin(r, T) (skipped when temperature is None);
    R = steps_to_end_tokens(rloo_baseline(r*)) + c·RLOO(solved − 1) at the
    last token + extra (e.g. −β·KL);  G = reverse cumsum(R) (γ = 1);
    G = 0 on step ends (optional);  A = pure_normalize(G) (optional).

  Args:
    step_rewards: [B, S] PRM step rewards (invalid steps ignored).
    step_ids: [B, T] int step ids.
    response_mask: [B, T] response mask.
    group_size: static n.
    temperature: softmin T, or None to use `step_rewards` as given.
    solved: optional [B] 0/1 verifier outcome (1 where there is no answer).
    verifiable_coef: weight of the verifiable reward.
    extra_token_rewards: optional [B, T] added token rewards (−β·KL).
    baseline: 'token' (default) or 'step'.
    mask_step_ends: zero the returns on step-end tokens.
    normalize: apply `pure_normalize`.
    step_end_mask: optional [B, T] bool step ends for `mask_step_ends`
      (see `mask_step_end_tokens`).
    axis_name: `shard_map` axis name, or None.

  Returns:
    (advantages [B, T], returns [B, T]) — returns before step-end masking.
  """
  ids = _checks.as_int(step_ids, "step_ids", "pure_advantages")
  step_mask = segments.step_mask_from_ids(ids, jnp.shape(step_rewards)[1])
  rewards = step_rewards
  if temperature is not None:
    rewards = softmin_step_rewards(rewards, step_mask, temperature)
  adjusted = pure_rloo_step_rewards(rewards, ids, response_mask, group_size,
                                    baseline=baseline, axis_name=axis_name)
  token_rewards = segments.steps_to_end_tokens(adjusted, ids)
  if solved is not None:
    solved = _checks.as_float(solved, "solved", "pure_advantages")
    verifiable = advantages_lib.group_advantages(
        solved - 1, group_size, estimator="rloo", axis_name=axis_name)
    token_rewards = token_rewards + verifiable_coef * (
        segments.outcome_token_rewards(verifiable, response_mask))
  if extra_token_rewards is not None:
    token_rewards = token_rewards + extra_token_rewards
  returns = returns_lib.reward_to_go(token_rewards, response_mask)
  advantages = (mask_step_end_tokens(returns, ids, step_end_mask)
                if mask_step_ends else returns)
  if normalize:
    advantages = pure_normalize(advantages, response_mask,
                                axis_name=axis_name)
  return advantages, returns
