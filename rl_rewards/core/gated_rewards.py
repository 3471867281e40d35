"""Outcome rewards combined with a whole-response thinking reward, gated.

Two methods score the reasoning of a response with one number from a
thinking/process reward model and guard that score against reward hacking
by the verifiable outcome. Both produce one scalar reward per response; the
group estimator (GRPO: `advantages.group_advantages`) comes after.

* Posterior-GRPO (Fan et al., "Posterior-GRPO: Rewarding Reasoning
  Processes in Code Generation", arXiv 2508.05170, §3.3 "P-GRPO"): the
  thinking reward counts only when the outcome is correct,
    R_i = R_f,i + R_o,i + R_o,i·R_t,i,   R_f, R_o ∈ {0, 1}, R_t ∈ [0, 1].
  No public code was found; the equation is the paper's composite reward as
  quoted by a third-party implementation. Whether R_t is normalised inside
  the group before gating was not verified: pass it as the caller wants it.
* Trust-GRPO (Fan et al., "SophiaVL-R1: Reinforcing MLLMs Reasoning with
  Thinking Reward", arXiv 2505.17018): r = r_ans + w·r_think with w the
  product of an annealed scale and a per-group trust factor that shrinks
  when incorrect responses get higher thinking rewards than correct ones.
  Semantics follow the code (kxfan2002/SophiaVL-R1,
  `verl/workers/reward/custom.py`, `CustomRewardManager.__call__` with
  n > 0; `main.py` passes T = `worker.reward.alpha` = 500, the trainer
  passes `steps = global_step`).
"""

import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib


def _per_row(x, name, fn, batch=None):
  x = _checks.as_float(x, name, fn)
  _checks.check_rank(x, 1, name, fn, "[B]")
  if batch is not None:
    _checks.check_batch(x, batch, name, fn)
  return x


def posterior_rewards(outcome_rewards, thinking_rewards, format_rewards=None,
                      *, correct_threshold=0.5) -> jnp.ndarray:
  """Posterior-GRPO's composite reward: thinking counts only when correct.

    R_i = R_f,i + R_o,i + 1[R_o,i > threshold]·R_t,i.

  For 0/1 outcomes the gate equals R_o (the paper writes R_o·R_t); the
  indicator also keeps a ±1 verifier from flipping the sign of R_t. R_t of
  an incorrect row is never read (it may be left unset, even NaN), so the
  reward model only needs to score the correct responses.

  Args:
    outcome_rewards: [B] verifiable outcome R_o (1 = all tests pass).
    thinking_rewards: [B] thinking reward R_t of the reasoning (a reward
      model's score, [0, 1] in the paper).
    format_rewards: optional [B] format reward R_f ∈ {0, 1}; None adds 0.
    correct_threshold: a response is correct when R_o exceeds it.

  Returns:
    [B] rewards, to be group-normalised by GRPO.
  """
  fn = "posterior_rewards"
  outcome = _per_row(outcome_rewards, "outcome_rewards", fn)
  batch = outcome.shape[0]
  thinking = _per_row(thinking_rewards, "thinking_rewards", fn, batch)
  rewards = outcome + jnp.where(outcome > correct_threshold, thinking, 0)
  if format_rewards is not None:
    rewards = rewards + _per_row(format_rewards, "format_rewards", fn, batch)
  return rewards


def trust_weighted_rewards(answer_rewards, thinking_rewards, group_size: int,
                           *, step, anneal_steps=500.0, base_weight=0.3,
                           correct_threshold=0.5, judge_threshold=0.2,
                           solved_threshold=0.9, failed_threshold=0.1,
                           axis_name=None):
  """SophiaVL-R1's trust-weighted thinking reward (Trust-GRPO).

  Per group g of n responses with answer rewards a_i and thinking rewards
  h_i (code semantics):

    g degenerate (every a ≥ solved_threshold or every a ≤ failed_threshold):
      r_i = a_i  (the thinking reward is not even requested);
    otherwise:
      h'_i = h_i if a_i ≥ judge_threshold else 0  (no judge call below it),
      C = {a ≥ correct_threshold},  W = the rest,
      μ_c = mean_{C} h', μ_w = mean_{W} h'  (0 for an empty set),
      trust_g = e^{μ_c − μ_w} if μ_c < μ_w and C ≠ ∅ else 1,
      w_g = base_weight·e^{−step/anneal_steps}·trust_g,
      r_i = a_i + w_g·h'_i.

  The paper states the trust factor as e^{μ_c − μ_w} when μ_c < μ_w and
  the annealed scale; the degenerate-group rule and the judge threshold
  are the code's. Thinking rewards are read only where the code requests
  them (non-degenerate groups, a ≥ judge_threshold); elsewhere they may be
  left unset, even NaN. The code also logs e^{2(μ_c − μ_w)} ("gamma") but never
  uses it.

  Args:
    answer_rewards: [B] answer (outcome) rewards in [0, 1].
    thinking_rewards: [B] thinking rewards in [0, 1] (from the judge).
    group_size: static n; groups contiguous.
    step: training step (scalar, may be traced).
    anneal_steps: T of e^{−step/T} (code: 500).
    base_weight: scale at step 0 (code: 0.3).
    correct_threshold: correct when a ≥ it (code: 0.5).
    judge_threshold: thinking reward kept when a ≥ it (code: 0.2).
    solved_threshold: all a ≥ it: outcome only (code: 0.9).
    failed_threshold: all a ≤ it: outcome only (code: 0.1).
    axis_name: `shard_map` axis name, or None.

  Returns:
    (rewards [B], weights [B]): the reward and the group's w_g per row.
  """
  fn = "trust_weighted_rewards"
  answers = _per_row(answer_rewards, "answer_rewards", fn)
  batch = answers.shape[0]
  thinking = _per_row(thinking_rewards, "thinking_rewards", fn, batch)

  def reduce(x, op="sum"):
    return advantages_lib.group_reduce(x, group_size, op,
                                       axis_name=axis_name)

  degenerate = ((reduce(answers, "min") >= solved_threshold)
                | (reduce(answers, "max") <= failed_threshold))
  judged = jnp.where((answers >= judge_threshold) & ~degenerate, thinking, 0)
  correct = (answers >= correct_threshold).astype(answers.dtype)
  n_correct = reduce(correct)
  n_wrong = reduce(1 - correct)
  mean_correct = reduce(correct * judged) / jnp.maximum(n_correct, 1)
  mean_wrong = reduce((1 - correct) * judged) / jnp.maximum(n_wrong, 1)
  gap = mean_correct - mean_wrong
  trust = jnp.where((gap < 0) & (n_correct > 0), jnp.exp(gap), 1)
  scale = base_weight * jnp.exp(
      -_checks.as_float(step, "step", fn) / anneal_steps)
  weights = jnp.where(degenerate, 0, scale * trust)
  return answers + weights * judged, weights
