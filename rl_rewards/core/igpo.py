"""IGPO: information-gain turn rewards for multi-turn episodes.

Wang et al., "Information Gain-based Policy Optimization: A Simple and
Effective Approach for Multi-Turn LLM Agents" (arXiv 2510.14967). An
episode's turns k = 0 … K_b − 1 are scored by how much each one raises the
policy's probability of the ground-truth answer a* = (a*_1, …, a*_L),
measured by appending a* right after the history:

  P_{b,j} = exp( (1/L) Σ_t log π(a*_t | prefix_{b,j}, a*_<t) ),

prefix_{b,0} the prompt, prefix_{b,j} (j ≥ 1) everything before turn j
starts (turn j − 1's tokens and the observation that followed it). Then

  r_{b,k} = P_{b,k+1} − P_{b,k}       k < K_b − 1   (information gain)
  r_{b,k} = R_b                       k = K_b − 1   (the outcome reward)

(the paper's Eq. for IG_t with 1 ≤ t < T, and the answer turn's outcome
reward). The rewards are z-scored within each prompt's group g (the n
contiguous rows of a prompt), over a set M of (row, turn) entries:

  r̂_{b,k} = (r_{b,k} − μ_g) / (σ_g + ε),
  μ_g = mean_{(i,j)∈M_g} r_{i,j},  σ_g = sqrt(var_{(i,j)∈M_g} r_{i,j} + 1e-8)

(population variance; σ_g = 1 when M_g holds at most one entry), with M
every valid turn of the group ("joint": IG and outcome rewards pooled), or
separately the answer turns and the other turns ("separate"). Each turn's
advantage is the discounted sum of the normalised rewards from it on:

  A_{b,k} = Σ_{j=k}^{K_b−1} γ^{j−k} r̂_{b,j},

put on every policy token of turn k by the caller.

Paper and code. P is the exponential of the MEAN token log-prob of a*
(geometric-mean probability), as the code computes it
(`scrl/llm_agent/generation.py`: `exp(old_log_probs[gt span].mean())`), so
the gains do not shrink with the answer's length. The normalisation and the
discounted sum follow the code's February 2026 update
(`compute_grpo_outcome_advantage` in `verl/trainer/ppo/core_algos.py`):
population std under sqrt(var + 1e-8), std 1 for groups with at most one
entry, division by (std + ε), ε = 1e-6; `info_gain_norm_mode` "joint"
(that function's default) or "separate" (what its training script sets);
γ = 1.0 (`algorithm.gamma` in its scripts). The turn reward is its
`info_gain_type="prob_diff"` (the generation code's default; the script's
"log_prob_diff", m_{k+1} − m_k, is not implemented here). (The first
release instead centred γ = 1 returns-to-go on the group mean per token
position, without a std.) One difference: the code marks a turn by a
nonzero reward on its last token, so a turn whose gain is exactly 0 is
left out of the group statistics and its tokens take the next turn's
advantage; here every valid turn counts (at γ = 1 the advantages of such a
turn agree; only μ_g and σ_g can differ).
"""

import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import returns

IGPO_NORMS = ("joint", "separate")
_VAR_FLOOR = 1e-8  # The code's sqrt(var + 1e-8).


def _last_turn_mask(turn_mask):
  """[B, S] True on each row's last valid turn (rows' turns a prefix)."""
  count = jnp.sum(turn_mask, axis=1)
  return jnp.arange(turn_mask.shape[1])[None, :] == (count - 1)[:, None]


def information_gain_rewards(answer_logprobs, outcome_rewards,
                             turn_mask) -> jnp.ndarray:
  """IGPO's turn rewards r_{b,k} (module docstring).

    P_{b,j} = exp(m_{b,j}),
    r_{b,k} = P_{b,k+1} − P_{b,k}  (k < K_b − 1),   r_{b,K_b−1} = R_b.

  Args:
    answer_logprobs: [B, S+1] m_{b,j}, the MEAN log-prob of the answer's
      tokens appended after prefix j (j = 0: the prompt; j ≥ 1: everything
      before turn j). Entries j ≥ K_b are ignored.
    outcome_rewards: [B] R_b, the episode's outcome reward.
    turn_mask: [B, S] valid turns, True for k < K_b (a prefix of each row).

  Returns:
    [B, S] float32 rewards, 0 on invalid turns.
  """
  fn = "information_gain_rewards"
  m = _checks.as_float(answer_logprobs, "answer_logprobs", fn)
  mask = _checks.as_mask(turn_mask, "turn_mask", fn)
  outcome = _checks.as_float(outcome_rewards, "outcome_rewards", fn)
  _checks.check_rank(m, 2, "answer_logprobs", fn, "[B, S+1]")
  _checks.check_rank(mask, 2, "turn_mask", fn, "[B, S]")
  _checks.check_rank(outcome, 1, "outcome_rewards", fn, "[B]")
  b, s = mask.shape
  if m.shape != (b, s + 1):
    raise ValueError(
        f"{fn}: `answer_logprobs` must be [B, S+1] = [{b}, {s + 1}] for "
        f"`turn_mask` [{b}, {s}], got {tuple(m.shape)}.")
  _checks.check_batch(outcome, b, "outcome_rewards", fn)
  p = jnp.exp(m)
  gain = p[:, 1:] - p[:, :-1]
  r = jnp.where(_last_turn_mask(mask), outcome[:, None], gain)
  return jnp.where(mask, r, 0.0)


def _group_zscore(r, sel, n: int, eps: float):
  """(r − μ_g)/(σ_g + ε) on `sel`, group statistics over `sel` entries."""
  g = r.shape[0] // n
  rg = jnp.where(sel, r, 0.0).reshape(g, -1)
  sg = sel.reshape(g, -1).astype(r.dtype)
  count = jnp.sum(sg, axis=1)
  mean = jnp.sum(rg, axis=1) / jnp.maximum(count, 1.0)
  var = jnp.sum(sg * jnp.square(rg - mean[:, None]), axis=1) / jnp.maximum(
      count, 1.0)
  std = jnp.where(count <= 1, 1.0, jnp.sqrt(var + _VAR_FLOOR))
  mean = jnp.repeat(mean, n)[:, None]
  std = jnp.repeat(std, n)[:, None]
  return jnp.where(sel, (r - mean) / (std + eps), 0.0)


def igpo_normalize(turn_rewards, turn_mask, group_size: int, *,
                   norm: str = "joint", eps: float = 1e-6) -> jnp.ndarray:
  """Group z-score of the turn rewards (module docstring).

    r̂_{b,k} = (r_{b,k} − μ_g)/(σ_g + ε) over the set M of the row's group:
    joint: every valid turn; separate: answer turns (each row's last) and
    the other turns, each with its own μ_g, σ_g.

  Args:
    turn_rewards: [B, S] r_{b,k}.
    turn_mask: [B, S] valid turns (a prefix of each row).
    group_size: n, the contiguous rows of a prompt; must divide B.
    norm: "joint" or "separate".
    eps: ε.

  Returns:
    [B, S] float32, 0 on invalid turns.
  """
  fn = "igpo_normalize"
  r = _checks.as_float(turn_rewards, "turn_rewards", fn)
  mask = _checks.as_mask(turn_mask, "turn_mask", fn)
  _checks.check_rank(r, 2, "turn_rewards", fn, "[B, S]")
  _checks.check_same_shape([r, mask], ["turn_rewards", "turn_mask"], fn)
  n = _checks.check_group_size(r.shape[0], group_size, fn)
  _checks.check_choice(norm, IGPO_NORMS, "norm", fn)
  if norm == "joint":
    return _group_zscore(r, mask, n, eps)
  last = _last_turn_mask(mask) & mask
  return (_group_zscore(r, last, n, eps) +
          _group_zscore(r, mask & ~last, n, eps))


def igpo_advantages(answer_logprobs, outcome_rewards, turn_mask,
                    group_size: int, *, gamma: float = 1.0,
                    norm: str = "joint", eps: float = 1e-6) -> jnp.ndarray:
  """IGPO's turn advantages A_{b,k} = Σ_{j≥k} γ^{j−k} r̂_{b,j}.

  `information_gain_rewards`, then `igpo_normalize`, then the discounted
  sum over each row's valid turns (module docstring).

  Args:
    answer_logprobs: [B, S+1] mean answer log-probs after each prefix.
    outcome_rewards: [B] outcome rewards.
    turn_mask: [B, S] valid turns (a prefix of each row).
    group_size: n.
    gamma: γ.
    norm: "joint" or "separate".
    eps: ε.

  Returns:
    [B, S] float32 turn advantages, 0 on invalid turns.
  """
  r = information_gain_rewards(answer_logprobs, outcome_rewards, turn_mask)
  z = igpo_normalize(r, turn_mask, group_size, norm=norm, eps=eps)
  return returns.discounted_returns(z, turn_mask, gamma=gamma)
