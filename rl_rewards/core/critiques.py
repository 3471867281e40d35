"""Rewards from a generative critic's verdicts on steps: CAPO and FAPO.

An LLM critic (a generative PRM) reads a whole response and names the steps
it finds wrong. Parsing its text into step indices is the caller's job;
these functions take the parsed verdicts as arrays.

* CAPO (Xie et al., "CAPO: Towards Enhancing LLM Reasoning through
  Verifiable Generative Credit Assignment", arXiv 2508.02298): token-level
  rewards. Every token of response i gets the weighted outcome, and the
  tokens of a step the critics mark wrong lose a process penalty:
    R_{i,t} = W_whole·r_v,i − W_process·1[k(t) ∈ E_i],
  r_v ∈ {0, 1} the verifier outcome, E_i the wrong steps after voting over
  C critiques of the response. W_whole > W_process keeps every correct
  response above every incorrect one (the paper's asymmetric design).
  The authors' code is unreleased (andyclsr/CAPO holds a README only); the
  equation is the paper's as quoted by a third-party implementation, and
  the paper's weight values, its preferred voting rule and how it
  normalises the token rewards into advantages were not verified: the
  weights are required arguments and normalisation is left to the caller.
* FAPO (Ding et al., "FAPO: Flawed-Aware Policy Optimization for Efficient
  and Reliable Reasoning", arXiv 2510.22543): a response with a correct
  answer whose process the GenRM flags (the earliest-error index it returns
  is not −1) is a "flawed positive" and loses λ:
    R = R_RLVR − λ·1[correct ∧ flawed],   R_RLVR = +1 / −1.
  The code (yyDing1/FAPO, `fapo/fapo_reasoning/reward_fn.py`,
  `compute_score_fapo`) sets the score of a flawed positive to 0.0, i.e.
  λ = 1 with ±1 rewards; the GenRM is queried only for correct answers and
  an unparsable verdict counts as not flawed.
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import segments

VOTING_RULES = ("majority", "intersection", "average")


def sample_critiques(key, step_scores, step_mask, num_critiques: int):
  """C critiques per response, sampled from a generative verifier's scores.

  A generative verifier that scores step k with P(correct) = s_{i,k} (the
  probability of its "correct" verdict token) gives, sampled at
  temperature 1, a critique that marks the step wrong with probability
  1 − s_{i,k}; C samples are C independent critiques of the response:

    f_{i,c,k} = 1[u_{i,c,k} ≥ s_{i,k}]·m_{i,k},   u ~ U[0, 1).

  Scores of exactly 0 or 1 (a step checker) give the same verdict in every
  critique.

  Args:
    key: a PRNG key.
    step_scores: [B, S] P(step k is correct).
    step_mask: [B, S] 1 on the response's steps.
    num_critiques: C ≥ 1.

  Returns:
    [B, C, S] bool: critique c marks step k wrong.
  """
  fn = "sample_critiques"
  scores = _checks.as_float(step_scores, "step_scores", fn)
  _checks.check_rank(scores, 2, "step_scores", fn, "[B, S]")
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_same_shape([scores, mask], ["step_scores", "step_mask"], fn)
  if num_critiques < 1:
    raise ValueError(f"{fn}: num_critiques must be >= 1, got "
                     f"{num_critiques}.")
  u = jax.random.uniform(key, (scores.shape[0], num_critiques,
                               scores.shape[1]))
  return (u >= scores[:, None, :]) & mask[:, None, :]


def vote_wrong_steps(step_flags, critique_mask=None, *,
                     voting: str = "majority") -> jnp.ndarray:
  """Combines C critiques of each response into one wrongness per step.

    v_{i,k} = Σ_c f_{i,c,k}·m_{i,c},   C_i = Σ_c m_{i,c} (valid critiques);
    majority: 1[v > C_i/2];   intersection: 1[v = C_i > 0];
    average:  v / C_i ∈ [0, 1] (a fractional penalty).

  The three rules are the ones a summary of the paper lists (majority,
  intersection, average vote); their exact definitions here are ours.

  A response without a valid critique gets 0 (no penalty) under every rule.

  Args:
    step_flags: [B, C, S] 1 where critique c marks step k wrong.
    critique_mask: optional [B, C], 0 for critiques that failed to parse.
    voting: 'majority', 'intersection' or 'average'.

  Returns:
    [B, S] float wrongness in [0, 1].
  """
  fn = "vote_wrong_steps"
  _checks.check_choice(voting, VOTING_RULES, "voting", fn)
  flags = _checks.as_mask(step_flags, "step_flags", fn)
  _checks.check_rank(flags, 3, "step_flags", fn, "[B, C, S]")
  if critique_mask is None:
    valid = jnp.ones(flags.shape[:2], bool)
  else:
    valid = _checks.as_mask(critique_mask, "critique_mask", fn)
    _checks.check_rank(valid, 2, "critique_mask", fn, "[B, C]")
    _checks.check_same_shape([valid, flags[:, :, 0]],
                             ["critique_mask", "step_flags[:, :, 0]"], fn)
  votes = jnp.sum(flags & valid[:, :, None], axis=1).astype(jnp.float32)
  critiques = jnp.sum(valid, axis=1, keepdims=True).astype(jnp.float32)
  if voting == "majority":
    wrong = 2 * votes > critiques
  elif voting == "intersection":
    wrong = (votes == critiques) & (critiques > 0)
  else:
    return votes / jnp.maximum(critiques, 1)
  return wrong.astype(jnp.float32)


def capo_token_rewards(outcome_rewards, step_wrongness, step_ids,
                       response_mask, *, w_whole, w_process) -> jnp.ndarray:
  """CAPO's token rewards: weighted outcome minus a wrong-step penalty.

    R_{i,t} = m_{i,t}·(W_whole·r_v,i − W_process·e_{i,k(t)}),

  e the voted wrongness of step k(t) (`vote_wrong_steps`; 0/1, or a vote
  fraction under 'average'). Steps past the last step of a row and tokens
  off the response carry nothing.

  Args:
    outcome_rewards: [B] verifier outcome r_v ∈ {0, 1}.
    step_wrongness: [B, S] voted wrongness of each step.
    step_ids: [B, T] int step ids, −1 off the response.
    response_mask: [B, T] response mask.
    w_whole: W_whole, the weight of the outcome.
    w_process: W_process, the penalty of a wrong step (W_process < W_whole
      keeps correct-but-flawed responses above incorrect ones).

  Returns:
    [B, T] token rewards (each token's own reward, no return over time).
  """
  fn = "capo_token_rewards"
  outcome = _checks.as_float(outcome_rewards, "outcome_rewards", fn)
  _checks.check_rank(outcome, 1, "outcome_rewards", fn, "[B]")
  wrong = _checks.as_float(step_wrongness, "step_wrongness", fn)
  _checks.check_rank(wrong, 2, "step_wrongness", fn, "[B, S]")
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(mask, 2, "response_mask", fn, "[B, T]")
  _checks.check_same_shape([ids, mask], ["step_ids", "response_mask"], fn)
  for name, x in (("step_wrongness", wrong), ("response_mask", mask)):
    _checks.check_batch(x, outcome.shape[0], name, fn)
  ids = jnp.where(mask, ids, -1)
  penalty = segments.steps_to_tokens(wrong, ids)
  return jnp.where(mask, w_whole * outcome[:, None] - w_process * penalty, 0)


def fapo_rewards(correct, flawed, *, penalty=1.0, correct_reward=1.0,
                 incorrect_reward=-1.0) -> jnp.ndarray:
  """FAPO's outcome reward with the flawed-positive penalty.

    R_i = (correct_i ? correct_reward : incorrect_reward)
          − λ·1[correct_i ∧ flawed_i].

  Defaults reproduce the code: +1 / −1 and a flawed positive scored 0.

  Args:
    correct: [B] verifier outcome, bool or 0/1.
    flawed: [B] GenRM verdict, True when it returns an earliest-error step
      (index ≠ −1); ignored for incorrect responses.
    penalty: λ.
    correct_reward: reward of a correct answer.
    incorrect_reward: reward of an incorrect answer.

  Returns:
    [B] rewards, to be group-normalised by GRPO.
  """
  fn = "fapo_rewards"
  correct = _checks.as_mask(correct, "correct", fn)
  flawed = _checks.as_mask(flawed, "flawed", fn)
  _checks.check_rank(correct, 1, "correct", fn, "[B]")
  _checks.check_rank(flawed, 1, "flawed", fn, "[B]")
  _checks.check_batch(flawed, correct.shape[0], "flawed", fn)
  base = jnp.where(correct, correct_reward, incorrect_reward).astype(
      jnp.float32)
  return base - penalty * (correct & flawed).astype(jnp.float32)
