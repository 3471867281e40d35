"""TP-GRPO: thought-level process rewards with a capability-adaptive weight.

He et al., "Good Learners Think Their Thinking: Generative PRM Makes Large
Reasoning Model More Efficient Math Learner", arXiv 2507.23317; published at
ICLR 2026 as "Smarter Not Harder: Generative Process Evaluation with
Intrinsic-Signal Driving and Ability-Adaptive Reward Shaping"
(https://openreview.net/forum?id=LZZENDlZt9).

Provenance. Neither the paper's PDF nor its code (github.com/cs-holder/
tp_grpo) could be read. The formulas tagged [paper] come from a structured
reading note of the ICLR version (en.papernotes.org, ICLR2026/llm_reasoning)
and from the public OpenReview reviews, which quote the paper's lines
(r^c = α·acc_G, "acc_G = 0 reduces to outcome-supervision GRPO", the
advantage of Eq. 3 as a sum of later rewards). Parts tagged [ours] are this
module's choices, with the reason. All of it is unverified against the PDF.

For the G = n samples o_1..o_n of one prompt (Stage II, "rewarding"):

1. [paper] Thoughts. A judge labels each step; maximal runs of consecutive
   steps with the same label are merged into one thought (the S1 ablation).
   Labels therefore alternate from one thought to the next.
2. [paper] Outcome. r̂^o_i = (r_i − mean_g(r)) / std_g(r), GRPO's group
   normalisation (here `group_advantages`: unbiased std + eps). Process
   rewards are *not* normalised (unlike DeepSeekMath process supervision).
3. [paper] Capability-adaptive weight (S2): r^c = α·acc_G, acc_G the accuracy
   of the n samples of the prompt, α > 0. acc_G = 0 (hard prompt): no process
   reward, plain outcome GRPO, exploration. acc_G = 1 (easy prompt): the
   strongest process signal, exploitation.
4. [paper] Thought rewards r_{i,k}:
     o_i correct:    +r^c on a correct thought, −r^c on an incorrect one;
     o_i incorrect:  r̂^o_i (≤ 0) on a thought that matches the wrong answer,
                     −r̂^o_i (≥ 0) on one that does not (exploration that did
                     not lead to the answer is not punished).
5. [paper] Advantage: the rewards at or after the token are summed (Eq. 3,
   the DeepSeekMath process-supervision form, γ = 1):
     A_{i,t} = r̂^o_i + Σ_{k(t) ≤ k < K_i − 1} r_{i,k},
   thoughts k = 0..K_i − 1 of response i, k(t) the thought of token t.
   [ours] The last thought K_i − 1 carries no process reward: it ends on the
   last token, where the outcome sits. This is the reading under which the
   paper's Propositions 1-2 hold exactly: labels alternate, so the sums
   telescope,
     correct o_i, last thought correct:   A = r̂^o_i on correct thoughts and
                                          r̂^o_i − r^c on incorrect ones;
     incorrect o_i, last thought matches: A = r̂^o_i on matching thoughts and
                                          0 on the others,
   so the tokens that decide the optimisation direction keep the outcome
   target and process rewards only de-weight the rest. Rewarding the last
   thought too would shift every advantage of the row by its reward.

[ours] One binary verdict per step serves both cases: good = verdict >
`verdict_threshold` means "correct step" in a correct response and "not
blamed for the wrong answer" (the paper's "uncertain", mismatched step) in
an incorrect one; bad means "incorrect step" / "matches the wrong answer".
With step-correctness verdicts (a PRM, the task's oracle), the correct steps
of a wrong response, e.g. those before its first error, are not penalised.
[ours] A response counts as correct when its outcome reward exceeds
`correct_threshold` = 0.5 (0/1 and ±1 verifier rewards alike).
[ours] α = 1 by default: the paper's ablation replaces the adaptive reward by
a static ±1, which α = 1 reproduces at acc_G = 1; the paper's own α was not
read.
[paper, left to the caller] Training keeps only responses whose process
reward is non-zero; that is a data filter, not part of the advantage.

Everything is jittable with static shapes; [B, T] token arrays, [B, S] step
arrays, groups contiguous (`group_size` static), as in `advantages`.
"""

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib
from rl_rewards.core import process
from rl_rewards.core import returns as returns_lib
from rl_rewards.core import segments


class Thoughts(NamedTuple):
  """Thought segmentation of a batch (see `segment_thoughts`).

  Attributes:
    token_ids: [B, T] int32 thought of every token, −1 on prompt/padding.
    step_to_thought: [B, S] int32 thought of every step, −1 on invalid steps.
    good: [B, S] bool verdict of every thought (False past the last).
    mask: [B, S] bool, True for the K_b valid thoughts of row b (a prefix).
  """
  token_ids: jnp.ndarray
  step_to_thought: jnp.ndarray
  good: jnp.ndarray
  mask: jnp.ndarray


def segment_thoughts(step_verdicts, step_ids, step_mask, *,
                     threshold=0.5) -> Thoughts:
  """Merges consecutive steps with the same verdict into thoughts (TP-GRPO).

    good_k = verdict_k > threshold;
    thought(k) = #{1 ≤ j ≤ k : good_j ≠ good_{j−1}}   over valid steps.

  Args:
    step_verdicts: [B, S] step verdicts: 1/0 labels, ±1, or judge
      probabilities; binarised at `threshold` before merging.
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    step_mask: [B, S] step mask (valid steps a prefix).
    threshold: a step is good when its verdict exceeds it.

  Returns:
    `Thoughts` (token ids [B, T], step -> thought [B, S], thought verdicts
    and mask [B, S]).
  """
  fn = "segment_thoughts"
  verdicts = _checks.as_float(step_verdicts, "step_verdicts", fn)
  _checks.check_rank(verdicts, 2, "step_verdicts", fn, "[B, S]")
  token_ids, step_to_thought, labels, mask = process.merge_steps_by_label(
      step_ids, verdicts > threshold, step_mask)
  return Thoughts(token_ids, step_to_thought, (labels > 0.5) & mask, mask)


def capability_adaptive_weight(accuracy, *, alpha=1.0) -> jnp.ndarray:
  """The process-reward scale of correct responses: r^c = α·acc_G.

  TP-GRPO's ability-adaptive reward: no process reward on prompts the policy
  never solves (acc 0: outcome GRPO, exploration), full strength α on those
  it always solves (exploitation).

  Args:
    accuracy: acc_G in [0, 1], a scalar or any array (e.g. [B] per-sample
      group accuracy from `group_accuracy`).
    alpha: α ≥ 0 (the paper requires α > 0; 0 switches the reward off).

  Returns:
    r^c, shaped like `accuracy`.
  """
  fn = "capability_adaptive_weight"
  if isinstance(alpha, (int, float, np.number)) and not alpha >= 0:
    raise ValueError(f"{fn}: `alpha` must be >= 0, got {alpha}.")
  return alpha * _checks.as_float(accuracy, "accuracy", fn)


def group_accuracy(outcome_rewards, group_size: int, *,
                   correct_threshold=0.5, axis_name=None) -> jnp.ndarray:
  """acc_G of every sample: the fraction of correct samples in its group.

    acc_i = (1/n) Σ_{j∈g(i)} 1[r_j > correct_threshold].

  Args:
    outcome_rewards: [B] outcome rewards, groups of `group_size` contiguous.
    group_size: static n; must divide the (global) batch.
    correct_threshold: a sample is correct when its reward exceeds it.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B] float accuracies.
  """
  fn = "group_accuracy"
  rewards = _checks.as_float(outcome_rewards, "outcome_rewards", fn)
  _checks.check_rank(rewards, 1, "outcome_rewards", fn, "[B]")
  correct = (rewards > correct_threshold).astype(rewards.dtype)
  return advantages_lib.group_reduce(correct, group_size, "sum",
                                     axis_name=axis_name) / group_size


def thought_rewards(thought_good, thought_mask, outcome_correct,
                    outcome_advantages, weight) -> jnp.ndarray:
  """TP-GRPO's process reward of every thought but the last.

    correct row:    r_k = +r^c (good thought),  −r^c (bad thought);
    incorrect row:  r_k = −r̂^o (good thought),  r̂^o (bad thought);
    r_k = 0 for the last thought k = K_b − 1 and for invalid thoughts.

  The last thought's signal is the outcome advantage r̂^o itself (see the
  module docstring: this keeps Propositions 1-2 of the paper exact).

  Args:
    thought_good: [B, S] bool verdict of each thought.
    thought_mask: [B, S] thought mask (valid thoughts a prefix).
    outcome_correct: [B] bool, whether each response is correct.
    outcome_advantages: [B] r̂^o, the group-normalised outcome reward.
    weight: r^c, a scalar or [B] (`capability_adaptive_weight`).

  Returns:
    [B, S] thought rewards.
  """
  fn = "thought_rewards"
  good = _checks.as_mask(thought_good, "thought_good", fn)
  mask = _checks.as_mask(thought_mask, "thought_mask", fn)
  _checks.check_rank(mask, 2, "thought_mask", fn, "[B, S]")
  _checks.check_same_shape([good, mask], ["thought_good", "thought_mask"], fn)
  batch, num_thoughts = mask.shape
  correct = _checks.as_mask(outcome_correct, "outcome_correct", fn)
  outcome = _checks.as_float(outcome_advantages, "outcome_advantages", fn)
  for name, x in (("outcome_correct", correct),
                  ("outcome_advantages", outcome)):
    _checks.check_rank(x, 1, name, fn, "[B]")
    _checks.check_batch(x, batch, name, fn)
  weight = _per_sample(weight, batch, "weight", fn)
  sign = jnp.where(good, 1.0, -1.0).astype(outcome.dtype)
  rewards = jnp.where(correct[:, None], sign * weight[:, None],
                      -sign * outcome[:, None])
  count = jnp.sum(mask, axis=1, keepdims=True)
  is_last = jnp.arange(num_thoughts)[None, :] == count - 1
  return jnp.where(mask & ~is_last, rewards, 0)


def tp_grpo_advantages(step_verdicts, step_ids, response_mask,
                       outcome_rewards, group_size: int, *, alpha=1.0,
                       accuracy=None, verdict_threshold=0.5,
                       correct_threshold=0.5, estimator: str = "grpo",
                       eps: float = 1e-6, std_ddof: int = 1,
                       axis_name=None) -> jnp.ndarray:
  """Token advantages of TP-GRPO (thought-level, capability-adaptive).

    r̂^o_i = group_advantages(r)_i,   r^c_i = α·acc_{g(i)},
    A_{i,t} = m_{i,t}·(r̂^o_i + Σ_{k(t) ≤ k < K_i − 1} r_{i,k}),

  k(t) the thought of token t, r_{i,k} from `thought_rewards`. With the last
  thought correct (correct response) or blamed (incorrect response) this is
  r̂^o on correct / blamed thoughts, r̂^o − r^c on incorrect thoughts of a
  correct response and 0 on unblamed thoughts of an incorrect one. A group
  whose outcomes are all equal has r̂^o = 0: all correct (acc 1) still
  penalises incorrect thoughts by −α; all wrong (acc 0) gives 0 everywhere.

  Args:
    step_verdicts: [B, S] per-step verdicts (1 good / 0 bad, ±1, or a judge's
      probability); S ≥ the number of steps of every row.
    step_ids: [B, T] int step ids, −1 off the response.
    response_mask: [B, T] response mask.
    outcome_rewards: [B] verifier rewards, groups contiguous.
    group_size: static n; must divide the (global) batch.
    alpha: α of r^c = α·acc_G.
    accuracy: acc_G override, a scalar or [B] (e.g. a running accuracy);
      None (default) uses each prompt's group accuracy.
    verdict_threshold: a step is good when its verdict exceeds it.
    correct_threshold: a response is correct when its reward exceeds it.
    estimator: outcome normalisation, 'grpo' (paper) or 'drgrpo' / 'rloo'.
    eps: added to the group std ('grpo').
    std_ddof: 1 (unbiased, default) or 0.
    axis_name: `shard_map` axis name for the group statistics, or None.

  Returns:
    [B, T] advantages, 0 on invalid tokens.
  """
  fn = "tp_grpo_advantages"
  verdicts = _checks.as_float(step_verdicts, "step_verdicts", fn)
  _checks.check_rank(verdicts, 2, "step_verdicts", fn, "[B, S]")
  ids = _checks.as_int(step_ids, "step_ids", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_rank(mask, 2, "response_mask", fn, "[B, T]")
  _checks.check_same_shape([ids, mask], ["step_ids", "response_mask"], fn)
  rewards = _checks.as_float(outcome_rewards, "outcome_rewards", fn)
  _checks.check_rank(rewards, 1, "outcome_rewards", fn, "[B]")
  batch = rewards.shape[0]
  for name, x in (("step_verdicts", verdicts), ("step_ids", ids)):
    _checks.check_batch(x, batch, name, fn)
  ids = jnp.where(mask, ids, -1)
  step_mask = segments.step_mask_from_ids(ids, verdicts.shape[1])
  thoughts = segment_thoughts(verdicts, ids, step_mask,
                              threshold=verdict_threshold)
  outcome = advantages_lib.group_advantages(
      rewards, group_size, estimator=estimator, eps=eps, std_ddof=std_ddof,
      axis_name=axis_name)
  if accuracy is None:
    accuracy = group_accuracy(rewards, group_size,
                              correct_threshold=correct_threshold,
                              axis_name=axis_name)
  weight = capability_adaptive_weight(_per_sample(accuracy, batch,
                                                  "accuracy", fn),
                                      alpha=alpha)
  per_thought = thought_rewards(thoughts.good, thoughts.mask,
                                rewards > correct_threshold, outcome, weight)
  thought_advantages = outcome[:, None] + returns_lib.step_returns(
      per_thought, thoughts.mask)
  return jnp.where(
      mask, segments.steps_to_tokens(thought_advantages, thoughts.token_ids),
      0)


def _per_sample(x, batch, name, fn):
  """A scalar or [B] array as a float [B] array."""
  x = _checks.as_float(x, name, fn)
  if x.ndim > 1 or (x.ndim == 1 and x.shape[0] != batch):
    raise ValueError(
        f"{fn}: `{name}` must be a scalar or have shape ({batch},), got "
        f"shape {tuple(x.shape)}.")
  return jnp.broadcast_to(x, (batch,))
