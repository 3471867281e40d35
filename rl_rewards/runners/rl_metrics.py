"""The RL stage's metrics: rollout statistics, the verifier's and the
process signal's agreement with the step checker, where the advantage is,
and the averaged update metrics.

Host-side functions take this process's rows of a rollout (whole groups)
and combine them over processes with `mesh.process_sums`, so every process
logs the numbers of a single-process run; `advantage_diagnostics` is
jittable and runs on the global batch.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import core
from rl_rewards.sharding import mesh as mesh_lib


def verifier_metrics(task) -> dict:
  """The outcome verifier's call counts of the last scoring (text tasks):
  `verifier/calls`, `timeouts`, `crashes`, `oversize`, `wrong_type`, ...
  summed over processes, and this process's slowest call `max_call_s`."""
  stats = getattr(task, "last_verifier_stats", None)
  if stats is None:
    return {}
  counts = stats.as_dict()
  slowest = counts.pop("max_call_s")
  out = {f"verifier/{k}": v for k, v in mesh_lib.process_sums(counts).items()}
  out["verifier/max_call_s"] = slowest
  return out


def rollout_metrics(scored, lengths, group_size: int,
                    has_step_labels: bool = True) -> dict:
  """Reward and behaviour statistics of a scored rollout batch.

  Besides reward, these expose reward hacking: steps per response, tokens per
  step, the fraction of empty steps, and answers that are right despite a
  wrong step. Each process passes its own rows (whole groups); means are
  sums over all processes' rows divided by counts (`mesh.process_sums`),
  e.g. reward_mean = Σ_i r_i / B.
  """
  rewards = np.asarray(scored.rewards, np.float64)
  lengths = np.asarray(lengths, np.float64)
  groups = rewards.reshape(-1, group_size)
  all_steps = np.array([len(l) > 0 and all(l) for l in scored.step_labels],
                       bool)
  steps_per = np.maximum(scored.num_steps, 1)
  total = mesh_lib.process_sums({
      "rows": rewards.size, "groups": groups.shape[0],
      "reward": rewards.sum(),
      "mixed": np.sum(groups.max(axis=1) != groups.min(axis=1)),
      "all_wrong": np.sum(groups.max(axis=1) <= 0),
      "all_right": np.sum(groups.min(axis=1) > 0),
      "length": lengths.sum(), "steps": np.sum(scored.num_steps),
      "tokens_per_step": np.sum(lengths / steps_per),
      "empty": np.sum(scored.empty_steps), "all_steps": all_steps.sum(),
      "right_with_wrong_step": np.sum((rewards > 0) & ~all_steps)})
  rows = max(total["rows"], 1)
  out = {
      "train/reward_mean": total["reward"] / rows,
      "train/mixed_groups": total["mixed"] / max(total["groups"], 1),
      # Groups whose samples all got the same outcome: no outcome signal.
      "train/zero_outcome_signal_groups": (
          1.0 - total["mixed"] / max(total["groups"], 1)),
      "train/all_wrong_groups": total["all_wrong"] / max(total["groups"], 1),
      "train/all_right_groups": total["all_right"] / max(total["groups"], 1),
      "train/response_length": total["length"] / rows,
      "train/steps_per_response": total["steps"] / rows,
      "train/tokens_per_step": total["tokens_per_step"] / rows,
      "train/empty_step_fraction": total["empty"] / max(total["steps"], 1),
  }
  if has_step_labels:
    out["train/all_steps_correct"] = total["all_steps"] / rows
    out["train/correct_with_wrong_step"] = (total["right_with_wrong_step"] /
                                            rows)
  return out


def prm_agreement_metrics(step_scores, step_ids, oracle_labels, rewards):
  """How a verifier's step scores agree with the outcome and the step checker.

  `prm/verifier_agreement`: the response-level verdict "min step score ≥ ½"
  equals the outcome reward; `prm/step_label_agreement`: per-step verdicts
  equal the ground-truth labels; `prm/first_error_agreement`: the first step
  scored below ½ is the first wrong step (both "none" counts as agreeing);
  `prm/min_step_position`: where in the response (0 = first step, 1 = last)
  the lowest score sits. Host arrays of this process's rows ([R, S] scores,
  [R, T] step ids, [R, S] labels, [R] rewards); the means are over all
  processes' rows (`mesh.process_sums`).
  """
  ids = np.asarray(step_ids)
  num_steps = np.maximum(ids.max(axis=1) + 1, 1)
  scores = np.asarray(step_scores, np.float64)
  labels = np.asarray(oracle_labels) >= 0.5
  valid = np.arange(scores.shape[1])[None, :] < num_steps[:, None]
  masked = np.where(valid, scores, np.inf)
  min_score = masked.min(axis=1)
  argmin = masked.argmin(axis=1)
  predicted_ok = min_score >= 0.5
  step_agree = ((scores >= 0.5) == labels)[valid]
  total = mesh_lib.process_sums({
      "rows": ids.shape[0], "steps": step_agree.size,
      "verifier": np.sum(predicted_ok == (np.asarray(rewards) > 0)),
      "step_label": step_agree.sum(),
      "first_error": np.sum(_first_false(masked >= 0.5, valid) ==
                            _first_false(labels, valid)),
      "position": np.sum(argmin / np.maximum(num_steps - 1, 1)),
      "last": np.sum(argmin == num_steps - 1),
      "score": scores[valid].sum()})
  rows, steps = max(total["rows"], 1), max(total["steps"], 1)
  return {
      "prm/verifier_agreement": total["verifier"] / rows,
      "prm/step_label_agreement": total["step_label"] / steps,
      "prm/first_error_agreement": total["first_error"] / rows,
      "prm/min_step_position": total["position"] / rows,
      "prm/min_at_last_step": total["last"] / rows,
      "prm/mean_step_score": total["score"] / steps,
  }


def _first_false(ok, valid):
  """[R] index of the first valid False of `ok` [R, S], −1 when none."""
  bad = valid & ~ok
  return np.where(bad.any(axis=1), bad.argmax(axis=1), -1)


def process_signal_metrics(step_process, row_kept, oracle_labels,
                           num_steps):
  """Where a method's process signal points, against the step checker.

  Args:
    step_process: [R, S] the process part of the advantage averaged over
      each step's tokens (`parts["process"]`, `tokens_to_steps(mean)`).
    row_kept: [R] bool, rows that take part in the update (not filtered).
    oracle_labels: [R, S] ground-truth step labels (1 correct, 0 wrong).
    num_steps: [R] steps of each response (slots 0 .. num_steps − 1).

  Returns (means over all processes' kept rows, `mesh.process_sums`):
    `train/process_signal_rows`: rows whose process part is non-zero on
      some step;
    `train/process_blames_first_error`: of the rows with a wrong step, those
      whose lowest process advantage (the earliest, on ties) is on the
      first wrong step;
    `train/process_negative_at_first_error`: of the same rows, those whose
      process advantage on the first wrong step is < 0;
    `train/process_negative_on_correct_rows`: of the rows with every step
      right, those with a negative process advantage on some step (credit
      taken from a correct solution).
  """
  values = np.asarray(step_process, np.float64)
  kept = np.asarray(row_kept, bool)
  steps = np.arange(values.shape[1])[None, :]
  valid = steps < np.asarray(num_steps)[:, None]
  labels = np.asarray(oracle_labels) >= 0.5
  first_error = _first_false(labels, valid)
  has_error = kept & (first_error >= 0)
  all_right = kept & (first_error < 0) & valid.any(axis=1)
  lowest = np.where(valid, values, np.inf).argmin(axis=1)
  at_error = values[np.arange(values.shape[0]), np.maximum(first_error, 0)]
  negative = (np.where(valid, values, 0.0) < -1e-8).any(axis=1)
  total = mesh_lib.process_sums({
      "kept": kept.sum(), "errors": has_error.sum(),
      "right": all_right.sum(),
      "signal": np.sum(kept & (np.abs(np.where(valid, values, 0.0)) >
                               1e-8).any(axis=1)),
      "blamed": np.sum(has_error & (lowest == first_error)),
      "negative": np.sum(has_error & (at_error < -1e-8)),
      "negative_right": np.sum(all_right & negative)})
  return {
      "train/process_signal_rows": total["signal"] / max(total["kept"], 1),
      "train/process_blames_first_error": (total["blamed"] /
                                           max(total["errors"], 1)),
      "train/process_negative_at_first_error": (total["negative"] /
                                                max(total["errors"], 1)),
      "train/process_negative_on_correct_rows": (total["negative_right"] /
                                                 max(total["right"], 1)),
  }


def advantage_diagnostics(advantages, parts: dict, response_mask) -> dict:
  """Where the learning signal is: jittable, over the valid tokens.

  `train/nonzero_advantage_fraction`: tokens with |A| > 1e-8;
  `train/advantage_var`: Var(A); `train/advantage_var_<part>`: the variance
  of each part of the method's split (`outcome`, `process`).
  """
  mask = response_mask > 0
  count = jnp.maximum(jnp.sum(mask), 1)
  out = {"train/nonzero_advantage_fraction":
             jnp.sum(mask & (jnp.abs(advantages) > 1e-8)) / count,
         "train/advantage_var": core.masked_var(advantages, mask,
                                                unbiased=False)}
  for name, part in parts.items():
    out[f"train/advantage_var_{name}"] = core.masked_var(part, mask,
                                                         unbiased=False)
  return out


def mean_update_metrics(records: list) -> dict:
  """Update metrics of every minibatch: the mean of each, `skipped` summed."""
  keys = records[0].keys()
  return {k: (float(np.sum([r[k] for r in records])) if k.endswith("skipped")
              else float(np.mean([r[k] for r in records]))) for k in keys}


def verifier_agreement(mesh, batch, oracle_labels, rewards) -> dict:
  """`prm_agreement_metrics` of the batch's `step_scores` (this process's
  rows of the global arrays) against the step checker's labels."""
  scores, step_ids = mesh_lib.local_rows((batch["step_scores"],
                                          batch["step_ids"]), mesh)
  return prm_agreement_metrics(scores, step_ids, oracle_labels, rewards)


@functools.partial(jax.jit, static_argnames=("num_steps",))
def _step_means(values, step_ids, num_steps: int):
  return core.tokens_to_steps(values, step_ids, num_steps, reduce="mean")


def process_signal(mesh, process, step_ids, row_weights, oracle_labels,
                   num_steps: int) -> dict:
  """`process_signal_metrics` of the process part of the advantage
  (`parts["process"]` [B, T], averaged over each step's tokens) on this
  process's rows; `row_weights` [R] the accuracy filter's weights of them."""
  local_process, local_ids = mesh_lib.local_rows(
      (_step_means(process, step_ids, num_steps), step_ids), mesh)
  return process_signal_metrics(local_process, row_weights > 0,
                                oracle_labels,
                                np.asarray(local_ids).max(axis=1) + 1)
