"""Step-level process rewards: progress (PAV), reward refinements, merging.

* Progress / PAV (Setlur et al., "Rewarding Progress", 2410.08146): a step's
  reward is the prover's advantage A^μ_k = Q^μ_k − Q^μ_{k−1}; a Best-of-K
  prover has Q^BoK = 1 − (1 − Q)^K. The RL signal on every token of step k is
  outcome advantage + α·A^μ_k, the step's *own* progress — not a sum over
  future steps (that telescopes to Rex − V^μ(s_k) and loses the signal).
  The same `progress` primitive serves MRT (Q = success of a forced answer)
  and IGPO (information-gain rewards, 2510.14967: Q_t = the policy's
  probability of the ground-truth answer after turn t, exp of the mean
  token log-probability of the answer's tokens as the paper's code computes
  it — a probability, not a log-probability — so a turn's reward is the
  gain Q_t − Q_{t−1}).
* Clip and Delta (Gao et al., 2410.15115): bound the return of PRM rewards.
* Thought merging (TP-GRPO): consecutive steps with the same label become one
  "thought".
* `aggregate_step_scores`: min / last / product / mean of step scores.

Step arrays are [B, S] with a step mask whose valid steps are a prefix.
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import segments

_AGGREGATIONS = ("min", "last", "product", "mean")


def _step_pair(values, step_mask, name, fn):
  values = _checks.as_float(values, name, fn)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_rank(values, 2, name, fn, "[B, S]")
  _checks.check_same_shape([values, mask], [name, "step_mask"], fn)
  return values, mask


def best_of_k(q, k) -> jnp.ndarray:
  """Success probability of a Best-of-K prover: Q^BoK = 1 − (1 − Q)^K.

  Args:
    q: success probabilities of the base policy, any shape, in [0, 1].
    k: number of samples K ≥ 1.

  Returns:
    Q^BoK, same shape as `q`.
  """
  if isinstance(k, (int, float)) and k < 1:
    raise ValueError(f"best_of_k: `k` must be >= 1, got {k}.")
  q = _checks.as_float(q, "q", "best_of_k")
  return 1 - jnp.power(1 - q, k)


def progress(step_values, initial_value, step_mask) -> jnp.ndarray:
  """Progress of each step: A_k = Q_k − Q_{k−1}, with Q_0 = initial_value.

  Args:
    step_values: [B, S] Q_k, the value after step k (e.g. Q^BoK of the prefix
      through step k).
    initial_value: [B] value of the bare question, V(s_1).
    step_mask: [B, S] step mask.

  Returns:
    [B, S] progress, 0 on invalid steps.
  """
  fn = "progress"
  values, mask = _step_pair(step_values, step_mask, "step_values", fn)
  initial = _checks.as_float(initial_value, "initial_value", fn)
  _checks.check_rank(initial, 1, "initial_value", fn, "[B]")
  _checks.check_batch(values, initial.shape[0], "step_values", fn)
  previous = jnp.concatenate([initial[:, None], values[:, :-1]], axis=1)
  return jnp.where(mask, values - previous, 0)


def effective_step_rewards(q_policy, prover_advantages, step_mask, *,
                           alpha) -> jnp.ndarray:
  """PAV's effective reward per step, Q^π_k + α·A^μ_k (beam-search score).

  Args:
    q_policy: [B, S] Q^π of each step (a PRM's prediction).
    prover_advantages: [B, S] A^μ from `progress`.
    step_mask: [B, S] step mask.
    alpha: α.

  Returns:
    [B, S], 0 on invalid steps.
  """
  fn = "effective_step_rewards"
  q, mask = _step_pair(q_policy, step_mask, "q_policy", fn)
  adv, _ = _step_pair(prover_advantages, step_mask, "prover_advantages", fn)
  return jnp.where(mask, q + alpha * adv, 0)


def pav_advantages(outcome_advantages, prover_advantages, step_ids,
                   response_mask, *, alpha) -> jnp.ndarray:
  """Token advantages of PAV-RL (PAV Eq. 5, effective reward).

    A_{b,t} = m_{b,t}·(A^out_b + α·A^μ_{b, k(t)}),  k(t) = step of token t.

  Args:
    outcome_advantages: [B] outcome advantage (Rex − baseline), e.g. from
      `group_advantages`.
    prover_advantages: [B, S] A^μ per step (`progress` of Q^μ).
    step_ids: [B, T] int step ids.
    response_mask: [B, T] response mask.
    alpha: α (0.5 for search, 3–5 for RL in the paper).

  Returns:
    [B, T] advantages, 0 on invalid tokens.
  """
  fn = "pav_advantages"
  outcome = _checks.as_float(outcome_advantages, "outcome_advantages", fn)
  _checks.check_rank(outcome, 1, "outcome_advantages", fn, "[B]")
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  per_token = segments.steps_to_tokens(prover_advantages, step_ids)
  _checks.check_same_shape([per_token, mask], ["step_ids", "response_mask"],
                           fn)
  _checks.check_batch(mask, outcome.shape[0], "response_mask", fn)
  return jnp.where(mask, outcome[:, None] + alpha * per_token, 0)


def clip_step_rewards(step_rewards, step_mask, *, eta) -> jnp.ndarray:
  """Clip refinement: r_k = min(r_process_k − η, 0), so every return ≤ 0."""
  rewards, mask = _step_pair(step_rewards, step_mask, "step_rewards",
                             "clip_step_rewards")
  return jnp.where(mask, jnp.minimum(rewards - eta, 0), 0)


def delta_step_rewards(step_rewards, step_mask) -> jnp.ndarray:
  """Delta refinement: differences of consecutive step rewards.

    r_k = p_k − p_{k+1} (k < K−1),  r_{K−1} = p_{K−1},  r_K = 0   (1-based),

  so the return from step k telescopes to p_k (k < K) and the last step's
  process reward is dropped (the outcome reward covers it). Apply after
  `clip_step_rewards` for Clip-Delta.

  Args:
    step_rewards: [B, S] process rewards p_k.
    step_mask: [B, S] step mask (valid steps a prefix).

  Returns:
    [B, S] refined rewards, 0 on invalid steps.
  """
  rewards, mask = _step_pair(step_rewards, step_mask, "step_rewards",
                             "delta_step_rewards")
  count = jnp.sum(mask, axis=1, keepdims=True)
  k = jnp.arange(rewards.shape[1])[None, :]
  following = jnp.pad(rewards[:, 1:], ((0, 0), (0, 1)))
  refined = jnp.where(k < count - 2, rewards - following,
                      jnp.where(k == count - 2, rewards, 0))
  return jnp.where(mask, refined, 0)


def aggregate_step_scores(step_scores, step_mask,
                          method: str = "min") -> jnp.ndarray:
  """One score per response from its step scores (Best-of-N, PRM eval).

  min (Math-Shepherd, implicit PRM), last (MC-trained PRMs), product
  (Lightman et al.), mean (PROF). Rows without valid steps score 0.

  Args:
    step_scores: [B, S] step scores.
    step_mask: [B, S] step mask.
    method: 'min', 'last', 'product' or 'mean'.

  Returns:
    [B] response scores.
  """
  fn = "aggregate_step_scores"
  _checks.check_choice(method, _AGGREGATIONS, "method", fn)
  scores, mask = _step_pair(step_scores, step_mask, "step_scores", fn)
  count = jnp.sum(mask, axis=1)
  if method == "min":
    out = jnp.min(jnp.where(mask, scores, jnp.inf), axis=1)
  elif method == "product":
    out = jnp.prod(jnp.where(mask, scores, 1), axis=1)
  elif method == "mean":
    out = jnp.sum(jnp.where(mask, scores, 0), axis=1) / jnp.maximum(count, 1)
  else:
    last = jnp.max(jnp.where(mask, jnp.arange(scores.shape[1]), -1), axis=1)
    out = jnp.take_along_axis(scores, jnp.maximum(last, 0)[:, None],
                              axis=1)[:, 0]
  return jnp.where(count > 0, out, 0)


def merge_steps_by_label(step_ids, step_labels, step_mask):
  """Merges runs of consecutive steps with equal labels into "thoughts".

    thought(k) = #{1 ≤ j ≤ k : label_j ≠ label_{j−1}}  over valid steps.

  Args:
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    step_labels: [B, S] step labels (e.g. 1 correct / 0 wrong from a judge).
    step_mask: [B, S] step mask (valid steps a prefix).

  Returns:
    (thought_ids [B, T] int32 with −1 on prompt/padding,
     step_to_thought [B, S] int32 with −1 on invalid steps,
     thought_labels [B, S] the label of each thought (0 past the last),
     thought_mask [B, S]).
  """
  fn = "merge_steps_by_label"
  labels = jnp.asarray(step_labels)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(labels, 2, "step_labels", fn, "[B, S]")
  _checks.check_same_shape([labels, mask], ["step_labels", "step_mask"], fn)
  _checks.check_batch(ids, labels.shape[0], "step_ids", fn)
  changes = jnp.pad(labels[:, 1:] != labels[:, :-1], ((0, 0), (1, 0)))
  changes = changes & mask
  step_to_thought = jnp.where(
      mask, jnp.cumsum(changes, axis=1, dtype=jnp.int32), -1)
  num_thoughts = jnp.max(step_to_thought, axis=1) + 1
  num_steps = labels.shape[1]
  thought_mask = jnp.arange(num_steps)[None, :] < num_thoughts[:, None]
  first_of_thought = mask & changes.at[:, 0].set(True)
  target = jnp.where(first_of_thought, step_to_thought, num_steps)
  float_labels = labels.astype(jnp.float32)

  def row(values, index):
    return jax.ops.segment_sum(values, index, num_segments=num_steps + 1)

  thought_labels = jax.vmap(row)(
      jnp.where(first_of_thought, float_labels, 0), target)[:, :num_steps]
  valid_ids = (ids >= 0) & (ids < num_steps)
  thought_ids = jnp.where(
      valid_ids,
      jnp.take_along_axis(step_to_thought, jnp.clip(ids, 0, num_steps - 1),
                          axis=1), -1)
  return (thought_ids.astype(jnp.int32), step_to_thought, thought_labels,
          thought_mask)
