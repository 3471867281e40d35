"""PRIME and implicit PRMs: process rewards from log-likelihood ratios.

Yuan et al., "Free Process Rewards without Process Labels" (2412.01981) and
Cui et al., "Process Reinforcement through Implicit Rewards" (2502.01456).
An implicit PRM is a language model π_φ whose log-ratio to a reference
defines token rewards r_t = β·log π_φ(y_t|y_<t)/π_ref(y_t|y_<t); its cumulative
sum q_t = Σ_{u≤t} r_u is a soft Q-value. PRIME trains it online with a
cross-entropy loss on outcome labels (see `losses.implicit_prm_ce_loss`) and
uses leave-one-out baselines per reward source.
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib
from rl_rewards.core import masking
from rl_rewards.core import returns as returns_lib
from rl_rewards.core import segments

_RLOO_FORMS = ("code", "paper")


def _token_pair(x, mask, x_name, fn):
  x = _checks.as_float(x, x_name, fn)
  mask = _checks.as_mask(mask, "response_mask", fn)
  _checks.check_rank(x, 2, x_name, fn, "[B, T]")
  _checks.check_same_shape([x, mask], [x_name, "response_mask"], fn)
  return x, mask


def implicit_token_rewards(logprobs, ref_logprobs, response_mask, *,
                           beta: float = 1.0,
                           drop_last_token: bool = False) -> jnp.ndarray:
  """Implicit process reward per token: r_t = β·(log π_φ − log π_ref)·m_t.

  The PRIME repository keeps β out of the reward (beta=1, scaled later by a
  reward coefficient) and uses it only in the CE loss; verl's PRIME recipe
  multiplies by β and drops the last valid token's reward
  (`drop_last_token=True`).

  Args:
    logprobs: [B, T] log π_φ of the sampled tokens.
    ref_logprobs: [B, T] log π_ref of the same tokens.
    response_mask: [B, T] response mask.
    beta: β.
    drop_last_token: zero the reward on the last valid token.

  Returns:
    [B, T] token rewards, 0 on invalid tokens.
  """
  fn = "implicit_token_rewards"
  logprobs, mask = _token_pair(logprobs, response_mask, "logprobs", fn)
  ref = _checks.as_float(ref_logprobs, "ref_logprobs", fn)
  _checks.check_same_shape([logprobs, ref], ["logprobs", "ref_logprobs"], fn)
  if drop_last_token:
    last = segments.last_valid_index(mask)
    mask = mask & (jnp.arange(mask.shape[1])[None, :] != last[:, None])
  return jnp.where(mask, beta * (logprobs - ref), 0)


def implicit_q_values(log_ratios, response_mask, *, beta: float):
  """q_t = β·Σ_{u≤t} log-ratio_u over valid tokens (0 on invalid tokens).

  Args:
    log_ratios: [B, T] log π_φ − log π_ref per token.
    response_mask: [B, T] response mask.
    beta: β.

  Returns:
    [B, T] soft Q-values q_t.
  """
  x, mask = _token_pair(log_ratios, response_mask, "log_ratios",
                        "implicit_q_values")
  q = jnp.cumsum(jnp.where(mask, beta * x, 0), axis=1)
  return jnp.where(mask, q, 0)


def implicit_step_rewards(log_ratios, step_ids, num_steps: int, *,
                          beta: float) -> jnp.ndarray:
  """Step reward = β·Σ log-ratio over the step's tokens = q_{e_k} − q_{e_{k−1}}.

  Args:
    log_ratios: [B, T] per-token log-ratios.
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    num_steps: static S.
    beta: β.

  Returns:
    [B, S] step rewards (aggregate with `aggregate_step_scores(..., 'min')`
    for a response score, as in the paper's Best-of-N).
  """
  x = _checks.as_float(log_ratios, "log_ratios", "implicit_step_rewards")
  return segments.tokens_to_steps(beta * x, step_ids, num_steps, "sum")


def prime_rloo(token_rewards, response_mask, group_size: int, *,
               form: str = "code", axis_name=None) -> jnp.ndarray:
  """Leave-one-out baseline on token rewards of one source (PRIME).

    m_i = mean of sample i's rewards over its valid tokens;
    code (default, PRIME/verl `masked_rloo`):
        r_{i,t}·n/(n−1) − Σ_{j∈g} m_j/(n−1)
        = r_{i,t} − mean_{j≠i} m_j + (r_{i,t} − m_i)/(n−1);
    paper (Eq. 5):  r_{i,t} − mean_{j≠i} m_j.

  The forms coincide for one reward per sample (outcome rewards). The
  default reproduces the code that produced PRIME's published results. A
  group of one keeps its rewards (baseline 0).

  Args:
    token_rewards: [B, T] rewards of one source.
    response_mask: [B, T] mask of positions holding rewards.
    group_size: static n.
    form: 'code' or 'paper'.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B, T] rewards after the baseline, 0 on invalid tokens.
  """
  fn = "prime_rloo"
  _checks.check_choice(form, _RLOO_FORMS, "form", fn)
  rewards, mask = _token_pair(token_rewards, response_mask, "token_rewards",
                              fn)
  rewards = jnp.where(mask, rewards, 0)
  batch = rewards.shape[0] * (
      1 if axis_name is None else jax.lax.axis_size(axis_name))
  n = _checks.check_group_size(batch, group_size, fn)
  if n == 1:
    return rewards
  means = masking.masked_mean(rewards, mask, axis=1)
  total = advantages_lib.group_reduce(means, n, axis_name=axis_name)
  if form == "code":
    adjusted = rewards * (n / (n - 1)) - (total / (n - 1))[:, None]
  else:
    adjusted = rewards - ((total - means) / (n - 1))[:, None]
  return jnp.where(mask, adjusted, 0)


def prime_batch_norm(token_rewards, response_mask, *, axis_name=None):
  """PRIME's 'batch_norm': R / (max_{i,t} |Σ_{u≥t} R_{i,u}| + 1e-6).

  Args:
    token_rewards: [B, T] rewards.
    response_mask: [B, T] response mask.
    axis_name: `shard_map` axis name (the max is global), or None.

  Returns:
    [B, T] rescaled rewards.
  """
  rewards, mask = _token_pair(token_rewards, response_mask, "token_rewards",
                              "prime_batch_norm")
  to_go = returns_lib.reward_to_go(rewards, mask)
  scale = jnp.max(jnp.abs(to_go))
  if axis_name is not None:
    scale = jax.lax.pmax(scale, axis_name)
  return jnp.where(mask, rewards, 0) / (scale + 1e-6)


def prime_advantages(process_token_rewards, outcome_scores, response_mask,
                     group_size: int, *, process_coef: float = 5.0,
                     outcome_coef: float = 5.0, form: str = "code",
                     batch_norm: bool = False, axis_name=None):
  """PRIME's advantage: per-source RLOO, γ = 1 returns, batch whitening.

    R = c_p·RLOO(r^φ) + c_o·RLOO(r^o)·1[t = t^last],
    G_t = Σ_{u≥t} R_u,   A = masked_whiten(G)   (batch-global, unbiased).

  Args:
    process_token_rewards: [B, T] implicit rewards (`implicit_token_rewards`).
    outcome_scores: [B] verifier outcomes (0/1, or pass rate for code).
    response_mask: [B, T] response mask.
    group_size: static n.
    process_coef: c_p (`reward_dpo_coef`, 5 in PRIME).
    outcome_coef: c_o (`reward_gt_coef`, 5 in PRIME).
    form: RLOO form for the process rewards, see `prime_rloo`.
    batch_norm: rescale the process rewards with `prime_batch_norm` first.
    axis_name: `shard_map` axis name, or None.

  Returns:
    (advantages [B, T], returns [B, T]).
  """
  process = process_token_rewards
  if batch_norm:
    process = prime_batch_norm(process, response_mask, axis_name=axis_name)
  process = prime_rloo(process, response_mask, group_size, form=form,
                       axis_name=axis_name)
  outcome = advantages_lib.group_advantages(
      outcome_scores, group_size, estimator="rloo", axis_name=axis_name)
  rewards = process_coef * process + outcome_coef * (
      segments.outcome_token_rewards(outcome, response_mask))
  returns = returns_lib.reward_to_go(rewards, response_mask)
  advantages = masking.masked_whiten(returns, response_mask,
                                     axis_name=axis_name)
  return advantages, returns
