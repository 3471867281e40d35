"""PROF: process-consistency filtering of rollouts before GRPO.

Ye et al., "Beyond Correctness: Harmonizing Process and Outcome Rewards
through RL Training" (arXiv 2509.03403). The PRM is not a reward here but a
filter: within each prompt's group, drop the correct responses whose steps
the PRM trusts least and the incorrect ones it trusts most, keeping the
correct/incorrect counts balanced, then run GRPO on the rows that are left.

Semantics follow the reference code (amazon-science/PROF-GRPO,
`prof_grpo/prof_grpo_both/prof_ray_trainer.py`: `compute_verify_step_level_
score` and `filter_trajectories`; `run_prof_grpo.sh` for the defaults):

1. `prof_scores`: consistency c_i = (1/H_i) Σ_k 2(p_{i,k} − p̄)(2y_i − 1),
   p_{i,k} the PRM's step probability p(+), H_i the number of scored steps,
   y_i ∈ {0, 1} the outcome and p̄ the mean step score over *all* valid
   steps of the batch; c_i = 0 when H_i = 0. The critic score subtracts a
   length penalty: s_i = c_i − λ·1[H_i < 2 or H_i > 30], λ = 10.
   The paper/README describe the statistic as "PRM averaged over steps" and
   a structured summary gives 1[H = 1 or H ≥ H_λ]; the code's batch-mean
   centring p̄ does not change the order within a class (it shifts every
   correct score by the same amount, every incorrect one by the opposite).
2. `prof_keep_mask`: per group, with N_+ correct and N_− incorrect rows and
   R = min(num_remove, N_+ + N_−) rows to drop ("prof_filter", 4 of n = 8):
     r_+ = clip(round((N_+ − N_− + R) / 2), 0, min(R, N_+)),
     r_− = min(R − r_+, N_−),
   remove the r_+ correct rows with the lowest score and the r_− incorrect
   rows with the lowest score (= the highest mean PRM). `round` is Python's
   round-half-to-even, as in the code; ties go to the earlier row (Python's
   stable sort). All-correct groups lose their R lowest, all-wrong groups
   likewise; nothing is kept that the code would drop.
3. `kept_group_advantages`: GRPO over the kept rows only (verl groups by
   uid after `batch = batch[kept]`): μ and the unbiased σ over the m kept
   rows of the group, A = (s − μ)/(σ + eps); a group with one kept row gets
   μ = 0, σ = 1 (verl); dropped rows get 0 and must get no loss weight.

Left to the loop: the code also truncates the kept batch to a multiple of
the number of GPUs (it drops the last rows of the batch); the PROF-correct
variant removes incorrect rows at random instead of by score.
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks
from rl_rewards.core import advantages as advantages_lib


def _psum(x, axis_name):
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def prof_scores(step_scores, step_mask, correct, *, min_steps: int = 2,
                max_steps: int = 30, length_penalty=10.0,
                axis_name=None) -> jnp.ndarray:
  """PROF's critic score of every response (consistency − length penalty).

    p̄ = Σ_{i,k valid} p_{i,k} / #valid steps of the batch,
    c_i = (1/H_i) Σ_{k<H_i} 2(p_{i,k} − p̄)(2y_i − 1)   (0 if H_i = 0),
    s_i = c_i − λ·1[H_i < min_steps or H_i > max_steps].

  Args:
    step_scores: [B, S] PRM step probabilities p(+) (invalid steps ignored).
    step_mask: [B, S] step mask.
    correct: [B] outcome, bool or 0/1.
    min_steps: responses with fewer scored steps are penalised (code: 2).
    max_steps: responses with more scored steps are penalised (code: 30).
    length_penalty: λ (code: `len_step_reward_coef` = 10, which puts every
      penalised row below every other row of its class).
    axis_name: `shard_map` axis name for the batch mean p̄, or None.

  Returns:
    [B] scores s_i.
  """
  fn = "prof_scores"
  scores = _checks.as_float(step_scores, "step_scores", fn)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_rank(scores, 2, "step_scores", fn, "[B, S]")
  _checks.check_same_shape([scores, mask], ["step_scores", "step_mask"], fn)
  correct = _checks.as_mask(correct, "correct", fn)
  _checks.check_rank(correct, 1, "correct", fn, "[B]")
  _checks.check_batch(scores, correct.shape[0], "step_scores", fn)
  values = jnp.where(mask, scores, 0)
  total = _psum(jnp.sum(values), axis_name)
  count = _psum(jnp.sum(mask, dtype=values.dtype), axis_name)
  mean = total / jnp.maximum(count, 1)
  steps = jnp.sum(mask, axis=1, dtype=values.dtype)
  sign = jnp.where(correct, 1.0, -1.0).astype(values.dtype)
  centred = jnp.sum(jnp.where(mask, 2 * (values - mean), 0), axis=1)
  consistency = jnp.where(steps > 0, sign * centred / jnp.maximum(steps, 1),
                          0)
  penalised = (steps < min_steps) | (steps > max_steps)
  return consistency - length_penalty * penalised.astype(values.dtype)


def prof_keep_mask(scores, correct, group_size: int, *, num_remove: int,
                   sample_mask=None) -> jnp.ndarray:
  """Which rows PROF keeps: per group, drop the lowest-scoring R rows so
  that correct and incorrect counts move towards balance.

    R = min(num_remove, N_+ + N_−),
    r_+ = clip(round_half_even((N_+ − N_− + R)/2), 0, min(R, N_+)),
    r_− = min(R − r_+, N_−);
    drop row i of class c if rank_c(i) < r_c, rank by (score, index).

  Args:
    scores: [B] critic scores (`prof_scores`; higher = more consistent).
    correct: [B] outcome, bool or 0/1.
    group_size: static n; groups are contiguous (B = P·n, prompt-major).
    num_remove: rows to remove per group (the code's `prof_filter`).
    sample_mask: optional [B] valid rows; invalid rows are neither counted
      nor kept (a group may hold fewer than n real responses).

  Returns:
    [B] bool keep mask.
  """
  fn = "prof_keep_mask"
  scores = _checks.as_float(scores, "scores", fn)
  _checks.check_rank(scores, 1, "scores", fn, "[B]")
  correct = _checks.as_mask(correct, "correct", fn)
  _checks.check_rank(correct, 1, "correct", fn, "[B]")
  _checks.check_batch(correct, scores.shape[0], "correct", fn)
  if isinstance(num_remove, bool) or not isinstance(num_remove, int) or (
      num_remove < 0):
    raise ValueError(
        f"{fn}: `num_remove` must be a Python int >= 0, got {num_remove!r}.")
  valid = (jnp.ones(scores.shape, bool) if sample_mask is None else
           _checks.as_mask(sample_mask, "sample_mask", fn))
  _checks.check_batch(valid, scores.shape[0], "sample_mask", fn)
  n = _checks.check_group_size(scores.shape[0], group_size, fn)
  shape = (-1, n)
  s, pos, ok = scores.reshape(shape), correct.reshape(shape), valid.reshape(
      shape)
  is_pos, is_neg = ok & pos, ok & ~pos
  n_pos = jnp.sum(is_pos, axis=1, keepdims=True).astype(jnp.int32)
  n_neg = jnp.sum(is_neg, axis=1, keepdims=True).astype(jnp.int32)
  remove = jnp.minimum(num_remove, n_pos + n_neg)
  half = jnp.round((n_pos - n_neg + remove).astype(jnp.float32) / 2)
  remove_pos = jnp.clip(half.astype(jnp.int32), 0,
                        jnp.minimum(remove, n_pos))
  remove_neg = jnp.minimum(remove - remove_pos, n_neg)
  # rank_i = #{j of the same class : (s_j, j) < (s_i, i)}.
  index = jnp.arange(n)
  before = (s[:, None, :] < s[:, :, None]) | (
      (s[:, None, :] == s[:, :, None]) & (index[None, :] < index[:, None]))
  same_class = (pos[:, None, :] == pos[:, :, None]) & ok[:, None, :]
  rank = jnp.sum(before & same_class, axis=2)
  drop = (is_pos & (rank < remove_pos)) | (is_neg & (rank < remove_neg))
  return (ok & ~drop).reshape(scores.shape)


def kept_group_advantages(scores, keep, group_size: int, *,
                          eps: float = 1e-6, std_ddof: int = 1,
                          axis_name=None) -> jnp.ndarray:
  """GRPO advantages with group statistics over the kept rows only.

    m_g = #kept in g,   μ_g = Σ_{kept} s / m_g,
    σ_g = sqrt(Σ_{kept} (s − μ_g)² / (m_g − ddof)),
    A_i = (s_i − μ_g)/(σ_g + eps) on kept rows, 0 on dropped rows;
    m_g = 1: μ = 0, σ = 1 (verl); kept scores all equal: A = 0 exactly.

  Args:
    scores: [B] outcome scores, groups contiguous.
    keep: [B] keep mask (e.g. `prof_keep_mask`).
    group_size: static n; must divide the (global) batch.
    eps: added to σ.
    std_ddof: 1 (unbiased, verl/torch.std) or 0.
    axis_name: `shard_map` axis name, or None.

  Returns:
    [B] advantages (broadcast with `segments.broadcast_to_tokens`).
  """
  fn = "kept_group_advantages"
  scores = _checks.as_float(scores, "scores", fn)
  _checks.check_rank(scores, 1, "scores", fn, "[B]")
  keep = _checks.as_mask(keep, "keep", fn)
  _checks.check_batch(keep, scores.shape[0], "keep", fn)
  batch = scores.shape[0] * (
      1 if axis_name is None else jax.lax.axis_size(axis_name))
  n = _checks.check_group_size(batch, group_size, fn)

  def reduce(x, op="sum"):
    return advantages_lib.group_reduce(x, n, op, axis_name=axis_name)

  kept = keep.astype(scores.dtype)
  count = reduce(kept)
  values = jnp.where(keep, scores, 0)
  mean = reduce(values) / jnp.maximum(count, 1)
  squares = reduce(jnp.where(keep, jnp.square(scores - mean), 0))
  dof = count - std_ddof
  std = jnp.where(dof > 0, jnp.sqrt(squares / jnp.where(dof > 0, dof, 1)), 0)
  mean = jnp.where(count == 1, 0, mean)
  std = jnp.where(count == 1, 1, std)
  spread = (reduce(jnp.where(keep, scores, -jnp.inf), "max")
            - reduce(jnp.where(keep, scores, jnp.inf), "min"))
  adv = (scores - mean) / (std + eps)
  adv = jnp.where((count == 1) | (spread > 0), adv, 0)
  return jnp.where(keep, adv, 0)
