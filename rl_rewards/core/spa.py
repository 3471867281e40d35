"""SPA: stepwise progress attribution of an episode's outcome to its turns.

Wang et al., "SPA-RL: Reinforcing LLM Agents via Stepwise Progress
Attribution" (arXiv 2505.20732; code WangHanLinHenry/SPA-RL-Agent,
`prm/train_our_progress_model.py`, `prm/rl_data_org.py`). A progress
estimator predicts a contribution ĉ_{b,k} for every turn k of episode b
(a scalar head read at the turn's last policy token) and is trained so that
the contributions of an episode add up to its outcome R_b:

    L = (1/|P|) Σ_{b∈P} (Σ_k m_{b,k}·ĉ_{b,k} − R_b)²,
    P = {b : episode b has at least one turn}

(the code's `MSELoss` of the summed turn values against the final reward).
The RL reward of turn k fuses the contribution with a grounding signal
g_{b,k} ∈ {0, 1} (1 when the turn's action was executed by the
environment, and always 1 on the last turn):

    r_{b,k} = α·ĉ_{b,k} + β·g_{b,k}

(the paper writes α·ĉ + β·g; the code adds 0.5 per executed action to ĉ,
α = 1, β = 0.5). The paper optimises with PPO (γ = 1, a value model); here
the returns-to-go of the fused rewards, plus an optional outcome term
η·R_b, are centred by a group-relative baseline over the episode returns
G_{b,0} of the n episodes of a prompt (`drgrpo`: the group mean, no std;
`rloo`: the mean of the other n − 1):

    G_{b,k} = η·R_b + Σ_{j ≥ k} m_{b,j}·r_{b,j},
    A_{b,k} = (G_{b,k} − baseline_b)·m_{b,k}.

Shapes: turn arrays are [B, S] with a `turn_mask` [B, S] (the valid turns of
a row, padded turns False); outcomes are [B]; groups are n contiguous rows.
Padded turns count nowhere: not in the sums, the returns or the loss.
"""

import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib
from rl_rewards.core import segments

BASELINES = ("drgrpo", "rloo")


def _turn_arrays(values, turn_mask, values_name, fn):
  values = _checks.as_float(values, values_name, fn)
  mask = _checks.as_mask(turn_mask, "turn_mask", fn)
  _checks.check_rank(values, 2, values_name, fn, "[B, S]")
  _checks.check_same_shape([values, mask], [values_name, "turn_mask"], fn)
  return values, mask


def turn_end_values(token_values, turn_ids, num_turns: int) -> jnp.ndarray:
  """Reads a token-level head at the last policy token of each turn.

    ĉ_{b,k} = Σ_{t ∈ E_{b,k}} x_{b,t},  E_{b,k} = the tokens t with
    turn_ids[b, t] = k whose next token is not in turn k

  One token per turn; a slot that merges several turns (ids clamped to S
  slots) sums their ends, so Σ_k ĉ_{b,k} still sums every turn.

  Args:
    token_values: [B, T] the head's output at every position.
    turn_ids: [B, T] int turn ids, −1 off the policy's tokens.
    num_turns: static S.

  Returns:
    [B, S] float32, 0 on turns a row does not have.
  """
  return segments.tokens_to_steps(token_values, turn_ids, num_turns,
                                  reduce="last")


def progress_row_losses(contributions, turn_mask, outcomes) -> jnp.ndarray:
  """[B] squared sum-to-outcome errors (Σ_k m_{b,k}·ĉ_{b,k} − R_b)².

  Args:
    contributions: [B, S] predicted contributions ĉ.
    turn_mask: [B, S] valid turns.
    outcomes: [B] outcome rewards R.

  Returns:
    [B] float32; 0 for rows without turns.
  """
  fn = "progress_row_losses"
  c, mask = _turn_arrays(contributions, turn_mask, "contributions", fn)
  r = _checks.as_float(outcomes, "outcomes", fn)
  _checks.check_rank(r, 1, "outcomes", fn, "[B]")
  _checks.check_batch(c, r.shape[0], "contributions", fn)
  total = jnp.sum(jnp.where(mask, c, 0.0), axis=1)
  return jnp.where(jnp.any(mask, axis=1), jnp.square(total - r), 0.0)


def progress_loss(contributions, turn_mask, outcomes) -> jnp.ndarray:
  """The estimator's loss L = mean over rows with turns of
  (Σ_k m_{b,k}·ĉ_{b,k} − R_b)² (module docstring); 0 if no row has a turn.

  Args:
    contributions: [B, S] predicted contributions ĉ.
    turn_mask: [B, S] valid turns.
    outcomes: [B] outcome rewards R.

  Returns:
    scalar float32.
  """
  losses = progress_row_losses(contributions, turn_mask, outcomes)
  present = jnp.any(_checks.as_mask(turn_mask, "turn_mask", "progress_loss"),
                    axis=1)
  return jnp.sum(losses) / jnp.maximum(jnp.sum(present), 1)


def fused_turn_rewards(contributions, turn_mask, grounding=None, *,
                       alpha: float = 1.0, beta: float = 0.0) -> jnp.ndarray:
  """SPA's turn rewards r_{b,k} = α·ĉ_{b,k} + β·g_{b,k} on valid turns.

  Args:
    contributions: [B, S] predicted contributions ĉ.
    turn_mask: [B, S] valid turns.
    grounding: [B, S] g ∈ {0, 1} (1: the action was executed), or None
      (every turn grounded).
    alpha: α, the contribution's weight.
    beta: β, the grounding reward.

  Returns:
    [B, S] float32, 0 on padded turns.
  """
  fn = "fused_turn_rewards"
  c, mask = _turn_arrays(contributions, turn_mask, "contributions", fn)
  if grounding is None:
    g = jnp.ones_like(c)
  else:
    g = _checks.as_float(grounding, "grounding", fn)
    _checks.check_same_shape([c, g], ["contributions", "grounding"], fn)
  return jnp.where(mask, alpha * c + beta * g, 0.0)


def spa_turn_advantages(contributions, turn_mask, outcomes, group_size: int,
                        grounding=None, *, alpha: float = 1.0,
                        beta: float = 0.0, outcome_coef: float = 0.0,
                        baseline: str = "drgrpo"):
  """Group-relative advantages of SPA's fused turn rewards.

    r_{b,k} = α·ĉ_{b,k} + β·g_{b,k}          (`fused_turn_rewards`)
    G_{b,k} = η·R_b + Σ_{j ≥ k} m_{b,j}·r_{b,j}
    A_{b,k} = (G_{b,k} − baseline_b)·m_{b,k},

  baseline_b over the episode returns G_{·,0} of b's group: their mean
  (`drgrpo`) or the mean of the other n − 1 (`rloo`); a group of one gets
  baseline 0 (as `group_advantages`).

  Args:
    contributions: [B, S] predicted contributions ĉ.
    turn_mask: [B, S] valid turns.
    outcomes: [B] outcome rewards R.
    group_size: n, contiguous rows per prompt.
    grounding: [B, S] g ∈ {0, 1}, or None (all 1).
    alpha: α.
    beta: β.
    outcome_coef: η, the weight of the outcome added to every return.
    baseline: 'drgrpo' or 'rloo'.

  Returns:
    (advantages [B, S], returns [B, S]) float32; both 0 on padded turns.
  """
  fn = "spa_turn_advantages"
  _checks.check_choice(baseline, BASELINES, "baseline", fn)
  rewards = fused_turn_rewards(contributions, turn_mask, grounding,
                               alpha=alpha, beta=beta)
  mask = _checks.as_mask(turn_mask, "turn_mask", fn)
  r = _checks.as_float(outcomes, "outcomes", fn)
  _checks.check_rank(r, 1, "outcomes", fn, "[B]")
  _checks.check_batch(rewards, r.shape[0], "contributions", fn)
  to_go = jnp.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
  returns = outcome_coef * r[:, None] + to_go
  episode = returns[:, 0]
  centred = advantages_lib.group_advantages(episode, group_size,
                                            estimator=baseline)
  base = episode - centred
  advantages = jnp.where(mask, returns - base[:, None], 0.0)
  return advantages, jnp.where(mask, returns, 0.0)
