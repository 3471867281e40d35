"""PRM evaluation metrics: ProcessBench-style F1, step AUROC, Best-of-N.

Host-side numpy functions of score tables (docs/algorithms.md, "PRM
evaluation"):

* ProcessBench. Every solution has a label: the 0-based index of its
  earliest wrong step, or −1 when every step is right. A PRM predicts the
  first step whose score is at most a threshold τ (−1 if none does;
  ProcessBench's code takes the argmax of a PRM's two classes, a tie going
  to the wrong class, so a step counts as right only when P(right) > τ);
  acc_err is the exact-match rate on erroneous solutions, acc_cor the rate
  of −1 predictions on correct ones, and F1 = 2·acc_err·acc_cor /
  (acc_err + acc_cor). τ is chosen on a validation set
  (`select_threshold`), never on the test set.
* Step AUROC: the probability that a random correct step scores higher than
  a random wrong one (ties count ½), over all labelled steps.
* Best-of-N. With M samples per problem, accuracy at N ≤ M averages
  over the M // N disjoint groups of N consecutive samples: prm@N picks the
  highest-scored sample of a group; maj@N the most frequent answer; weighted
  majority the answer with the largest summed score; pass@N whether any
  sample is right.

Step score tables are [B, S] with a step mask whose valid steps are a prefix.
"""

import numpy as np

# Thresholds tried by `select_threshold`.
THRESHOLD_GRID = np.round(np.linspace(0.01, 0.99, 99), 2)


def _step_table(step_scores, step_mask):
  scores = np.asarray(step_scores, np.float64)
  mask = np.asarray(step_mask, bool)
  if scores.ndim != 2 or scores.shape != mask.shape:
    raise ValueError(
        f"step_scores and step_mask must both be [B, S]; got shapes "
        f"{scores.shape} and {mask.shape}.")
  return scores, mask


def first_error_predictions(step_scores, step_mask,
                            threshold: float) -> np.ndarray:
  """Index of the first valid step scoring at most `threshold`, else −1.

    pred[b] = min{k : m[b, k] and s[b, k] ≤ τ}, or −1 when the set is empty.

  Args:
    step_scores: [B, S] step scores.
    step_mask: [B, S] step mask.
    threshold: τ; a step with score s ≤ τ is predicted wrong (ProcessBench:
      right only when s > τ).

  Returns:
    [B] int64 predicted first-error indices (−1: no error predicted).
  """
  scores, mask = _step_table(step_scores, step_mask)
  below = mask & (scores <= threshold)
  return np.where(below.any(axis=1), below.argmax(axis=1), -1)


def processbench_metrics(labels, predictions) -> dict:
  """ProcessBench accuracies and F1 (as fractions in [0, 1]).

  Args:
    labels: [B] true first-error indices, −1 for correct solutions.
    predictions: [B] predicted indices, −1 for "no error".

  Returns:
    dict with `acc_err` (exact match on erroneous solutions), `acc_cor`
    (−1 predicted on correct ones), `f1` (their harmonic mean; 0 if both are
    0), `num_err` and `num_cor`. An accuracy over an empty set is NaN and
    makes F1 NaN.
  """
  labels = np.asarray(labels)
  predictions = np.asarray(predictions)
  if labels.shape != predictions.shape or labels.ndim != 1:
    raise ValueError(f"labels and predictions must both be [B]; got shapes "
                     f"{labels.shape} and {predictions.shape}.")
  erroneous = labels != -1
  num_err, num_cor = int(erroneous.sum()), int((~erroneous).sum())
  acc_err = (float(np.mean(predictions[erroneous] == labels[erroneous]))
             if num_err else float("nan"))
  acc_cor = (float(np.mean(predictions[~erroneous] == -1))
             if num_cor else float("nan"))
  total = acc_err + acc_cor
  f1 = 2 * acc_err * acc_cor / total if total > 0 else (
      0.0 if total == 0 else float("nan"))
  return {"acc_err": acc_err, "acc_cor": acc_cor, "f1": f1,
          "num_err": num_err, "num_cor": num_cor}


def select_threshold(step_scores, step_mask, labels,
                     grid=THRESHOLD_GRID) -> tuple[float, float]:
  """The threshold of `grid` with the best F1 on a validation set.

  Ties go to the threshold closest to 0.5 (then the smaller one). When F1 is
  undefined for every threshold (a validation set without erroneous or
  without correct solutions), the result is (0.5, NaN).

  Args:
    step_scores: [B, S] validation step scores.
    step_mask: [B, S] step mask.
    labels: [B] validation first-error labels.
    grid: candidate thresholds.

  Returns:
    (threshold, its validation F1).
  """
  best, best_f1 = 0.5, float("nan")
  for threshold in sorted(grid, key=lambda t: (abs(t - 0.5), t)):
    f1 = processbench_metrics(
        labels, first_error_predictions(step_scores, step_mask, threshold)
    )["f1"]
    if not np.isnan(f1) and (np.isnan(best_f1) or f1 > best_f1):
      best, best_f1 = float(threshold), f1
  return best, best_f1


def auroc(scores, labels) -> float:
  """Area under the ROC curve of `scores` for binary `labels` (ties: ½).

  AUROC = P(s⁺ > s⁻) + ½·P(s⁺ = s⁻) over pairs of a positive and a negative,
  computed from mid-ranks (Mann–Whitney U). NaN if one class is empty.

  Args:
    scores: [N] scores (higher = more likely positive).
    labels: [N] 0/1 or bool labels.

  Returns:
    The AUROC in [0, 1], or NaN.
  """
  scores = np.asarray(scores, np.float64).ravel()
  labels = np.asarray(labels).astype(bool).ravel()
  if scores.shape != labels.shape:
    raise ValueError(f"scores and labels differ in size: {scores.shape} vs "
                     f"{labels.shape}.")
  num_pos, num_neg = int(labels.sum()), int((~labels).sum())
  if num_pos == 0 or num_neg == 0:
    return float("nan")
  order = np.argsort(scores, kind="mergesort")
  sorted_scores = scores[order]
  ranks = np.empty(len(scores), np.float64)
  start = 0
  while start < len(scores):  # Mid-ranks of runs of equal scores.
    end = start
    while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[
        start]:
      end += 1
    ranks[order[start:end + 1]] = (start + end) / 2 + 1
    start = end + 1
  u = ranks[labels].sum() - num_pos * (num_pos + 1) / 2
  return float(u / (num_pos * num_neg))


def step_auroc(step_scores, step_mask, step_labels) -> float:
  """AUROC of step scores against [B, S] 0/1 step labels on valid steps."""
  scores, mask = _step_table(step_scores, step_mask)
  labels = np.asarray(step_labels)
  if labels.shape != scores.shape:
    raise ValueError(f"step_labels shape {labels.shape} differs from "
                     f"step_scores shape {scores.shape}.")
  return auroc(scores[mask], labels[mask])


# ------------------------------------------------------------ Best-of-N ---


def _groups(table, n: int, name: str) -> np.ndarray:
  """[P, M, ...] -> [P, M // n, n, ...] disjoint consecutive groups."""
  table = np.asarray(table)
  if table.ndim < 2:
    raise ValueError(f"{name} must be [P, M], got shape {table.shape}.")
  problems, samples = table.shape[:2]
  if not 1 <= n <= samples:
    raise ValueError(f"n must be in [1, {samples}] (samples per problem), "
                     f"got {n}.")
  groups = samples // n
  return table[:, :groups * n].reshape(problems, groups, n, *table.shape[2:])


def best_of_n_accuracy(scores, correct, n: int) -> float:
  """prm@N: the correctness of the highest-scored sample of each group.

  Ties go to the earliest sample of the group.

  Args:
    scores: [P, M] response scores (e.g. aggregated PRM step scores).
    correct: [P, M] 0/1 outcome of each sample.
    n: N, samples per group.

  Returns:
    Mean over problems and groups.
  """
  scores_g = _groups(np.asarray(scores, np.float64), n, "scores")
  correct_g = _groups(np.asarray(correct, np.float64), n, "correct")
  pick = np.argmax(scores_g, axis=-1)
  return float(np.take_along_axis(correct_g, pick[..., None], -1).mean())


def pass_at_n(correct, n: int) -> float:
  """Fraction of groups of N with at least one correct sample."""
  return float(_groups(np.asarray(correct, np.float64), n, "correct")
               .max(axis=-1).mean())


def majority_vote_accuracy(answers, correct, n: int, weights=None) -> float:
  """maj@N (weights None) or weighted majority vote over groups of N.

  â = argmax_a Σ_{i in group} 1[ans_i = a]·w_i (w_i = 1 for plain voting).
  Samples without an answer (None: unparsable or unfinished) do not vote; a
  group where nobody votes counts as wrong. Ties go to the answer that
  appears first in the group. The vote is right if a sample carrying the
  winning answer is correct.

  Args:
    answers: [P][M] nested lists of hashable answers or None.
    correct: [P, M] 0/1 outcome of each sample.
    n: N, samples per group.
    weights: optional [P, M] non-negative vote weights.

  Returns:
    Mean over problems and groups.
  """
  correct = np.asarray(correct, np.float64)
  problems, samples = correct.shape
  if len(answers) != problems or any(len(a) != samples for a in answers):
    raise ValueError(f"answers must be [{problems}][{samples}] like correct.")
  if weights is None:
    weights = np.ones_like(correct)
  weights = np.asarray(weights, np.float64)
  if weights.shape != correct.shape:
    raise ValueError(f"weights shape {weights.shape} differs from correct "
                     f"shape {correct.shape}.")
  _groups(correct, n, "correct")  # Validates n.
  total, count = 0.0, 0
  for p in range(problems):
    for start in range(0, samples // n * n, n):
      tally, right = {}, {}
      for i in range(start, start + n):
        answer = answers[p][i]
        if answer is None:
          continue
        tally[answer] = tally.get(answer, 0.0) + weights[p, i]
        right[answer] = max(right.get(answer, 0.0), correct[p, i])
      if tally:
        winner = max(tally, key=lambda a: tally[a])  # First max on ties.
        total += right[winner]
      count += 1
  return total / count
