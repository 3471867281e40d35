"""MRT: a progress bonus per episode of a long reasoning stream.

Qu et al., "Optimizing Test-Time Compute via Meta Reinforcement Fine-Tuning"
(arXiv 2503.07572). The output stream z = (z_0, …, z_{K−1}) of a prompt c
is cut into episodes (the code's `analysis/code/break_into_meta_steps.ipynb`
splits the thinking at "Wait", "But wait", "Alternatively");
a meta-prover μ — the same model forced to stop thinking and answer after a
prefix — scores each prefix with its success probability
J_j = J_r(μ(·| z_{0:j}, c)), estimated by sampling forced answers.

Paper: the bonus is "the progress made by each subsequent block in the
output stream, quantified by the change in the likelihood of eventual
success" (abstract), i.e. for episode j
    r_prg(z_j; c) = J_r(μ(·| z_{0:j}, c)) − J_r(μ(·| z_{0:j−1}, c)),
J_{−1} = J_r(μ(·| c)) (answer without thinking), and MRT maximises
ℓ_outcome(π) + α·Σ_j E[r_prg(z_j; c)]. (Read from the abstract and a
structured summary; the PDF's section was not at hand.)

The public code (CMU-AIRe/MRT) releases no RL trainer: `train/rl/README.md`
instructs to replace GRPO's group-mean baseline by the reward of the
termination action,
    A_i = R_i − R_termination,i,
i.e. the outcome of a rollout minus the meta-prover's success when it
stops at the rollout's starting prefix. For the telescoping sum of the
paper's bonus this is the same quantity with α = 1: Σ_j r_prg = J_last −
J_{−1}, and with J_last replaced by the rollout's own outcome R_i, the
advantage is R_i − J_{−1}. The code path is `termination_advantages`; the
paper's per-episode credit is `mrt_advantages`, which gives each episode
its own progress (like PAV: no sum over later episodes, which would
telescope the signal away).

A second reading, J_r(μ(·|z_{0:j}, c)) − J_r(μ(·|c)) (every episode
measured against the bare prompt), is available as reference='prompt'.
"""

import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import process

_REFERENCES = ("previous", "prompt")


def mrt_progress(episode_values, initial_value, episode_mask, *,
                 reference: str = "previous") -> jnp.ndarray:
  """MRT's progress bonus of every episode.

    previous (paper): r_j = J_j − J_{j−1},  J_{−1} = J(μ | c);
    prompt:           r_j = J_j − J(μ | c).

  Args:
    episode_values: [B, S] J_j, the meta-prover's success after episode j.
    initial_value: [B] J(μ | c), its success with no thinking.
    episode_mask: [B, S] episode mask (valid episodes a prefix).
    reference: 'previous' (consecutive differences) or 'prompt'.

  Returns:
    [B, S] bonuses, 0 on invalid episodes.
  """
  fn = "mrt_progress"
  _checks.check_choice(reference, _REFERENCES, "reference", fn)
  if reference == "previous":
    return process.progress(episode_values, initial_value, episode_mask)
  values = _checks.as_float(episode_values, "episode_values", fn)
  mask = _checks.as_mask(episode_mask, "episode_mask", fn)
  _checks.check_rank(values, 2, "episode_values", fn, "[B, S]")
  _checks.check_same_shape([values, mask], ["episode_values",
                                            "episode_mask"], fn)
  initial = _checks.as_float(initial_value, "initial_value", fn)
  _checks.check_rank(initial, 1, "initial_value", fn, "[B]")
  _checks.check_batch(values, initial.shape[0], "episode_values", fn)
  return jnp.where(mask, values - initial[:, None], 0)


def mrt_advantages(outcome_advantages, episode_values, initial_value,
                   episode_ids, response_mask, *, alpha,
                   reference: str = "previous") -> jnp.ndarray:
  """Token advantages with MRT's dense progress bonus (paper form).

    A_{i,t} = m_{i,t}·(A^out_i + α·r_prg(z_{i,k(t)})),

  k(t) the episode of token t; A^out the outcome advantage (e.g. GRPO's
  `group_advantages` of the 0/1 outcome). Each token gets its own
  episode's progress, not a sum over later episodes.

  Args:
    outcome_advantages: [B] outcome advantages.
    episode_values: [B, S] meta-prover success J_j after each episode.
    initial_value: [B] J(μ | c).
    episode_ids: [B, T] int episode of each token, −1 off the response.
    response_mask: [B, T] response mask.
    alpha: α, the weight of the bonus.
    reference: see `mrt_progress`.

  Returns:
    [B, T] advantages, 0 on invalid tokens.
  """
  ids = _checks.as_int(episode_ids, "episode_ids", "mrt_advantages")
  mask = _checks.as_mask(response_mask, "response_mask", "mrt_advantages")
  _checks.check_same_shape([ids, mask], ["episode_ids", "response_mask"],
                           "mrt_advantages")
  ids = jnp.where(mask, ids, -1)
  episode_mask = (jnp.arange(jnp.shape(episode_values)[1])[None, :]
                  < (jnp.max(ids, axis=1, initial=-1) + 1)[:, None])
  bonus = mrt_progress(episode_values, initial_value, episode_mask,
                       reference=reference)
  return process.pav_advantages(outcome_advantages, bonus, ids, mask,
                                alpha=alpha)


def termination_advantages(scores, termination_values) -> jnp.ndarray:
  """MRT's code-path advantage: outcome minus the termination reward.

    A_i = R_i − J_r(μ(·| prefix_i, c)),

  the rollout's outcome against the meta-prover's success when it answers
  right at the prefix the rollout starts from (the bare prompt for a
  rollout from scratch), replacing GRPO's group mean (`train/rl/README.md`
  of the MRT code). No division by a group std.

  Args:
    scores: [B] outcome rewards R_i.
    termination_values: [B] termination reward of each rollout's prefix.

  Returns:
    [B] advantages (broadcast with `segments.broadcast_to_tokens`).
  """
  fn = "termination_advantages"
  scores = _checks.as_float(scores, "scores", fn)
  baseline = _checks.as_float(termination_values, "termination_values", fn)
  _checks.check_rank(scores, 1, "scores", fn, "[B]")
  _checks.check_rank(baseline, 1, "termination_values", fn, "[B]")
  _checks.check_batch(baseline, scores.shape[0], "termination_values", fn)
  return scores - baseline
