"""ProcessBench-format files: reading, scoring with a PRM, metrics, export.

A ProcessBench file (Zheng et al., 2412.06559; `Qwen/ProcessBench`) holds one
solution a row, read by `rl_rewards.data.readers` (JSONL, JSON or Parquet):

  id                    str or int (optional; default: the row's position)
  generator             str, the model that wrote the solution (optional)
  problem               str, the question
  steps                 list of str, the solution's steps in order
  label                 int, index of the earliest wrong step, −1 if none
  final_answer_correct  bool (optional)

Scoring follows the path RL uses (`prm/scoring.py`): the problem becomes the
prompt exactly as the task formats it (`task.encode_prompts`: the chat
template of a hub checkpoint with `task.prompt_template=chat`), the steps
are joined with the task's delimiter (`segmentation.join_steps`) and end with
the tokenizer's end-of-turn token, the step ids come from the token rule of
`segmentation.step_ids_from_tokens`, and step k's score is the verifier's
score at step k's last token. A row whose tokens do not split back into its
steps (a step holding the delimiter) is an input error, or, with
`inner_delimiter="space"`, has the delimiter inside its steps replaced by a
space.

Metrics per file (ProcessBench §3.1 and its `code/run_eval_prm_trl.py`):
step k is predicted wrong when its score s_k ≤ τ (the code takes the argmax
of the PRM's two classes, a tie going to the wrong class, i.e. τ = ½ on
P(correct)), the predicted index is the first such step (−1 if none), and

  acc_err = #{label ≠ −1, prediction = label} / #{label ≠ −1}
  acc_cor = #{label = −1, prediction = −1} / #{label = −1}
  F1 = 2·acc_err·acc_cor / (acc_err + acc_cor).

Step AUROC uses the step labels a first-error index implies: steps before
the label are correct, the labelled step is wrong, later steps are left out
(their correctness is unknown); every step of a label −1 solution is
correct.
"""

import dataclasses
import json
import os
from typing import Optional, Sequence

import numpy as np

from rl_rewards import errors
from rl_rewards.data import readers
from rl_rewards.prm import evaluation
from rl_rewards.prm import labels as labels_lib
from rl_rewards.prm import scoring
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib

# ProcessBench's PRM rule: P(correct) must exceed ½ (argmax of two classes).
DEFAULT_THRESHOLD = 0.5
INNER_DELIMITER = ("error", "space")
_COLUMNS = {"id", "generator", "problem", "steps", "label",
            "final_answer_correct"}


@dataclasses.dataclass(frozen=True)
class Row:
  """One solution of a ProcessBench file.

  Attributes:
    id: the row's id.
    problem: the question.
    steps: the solution's steps.
    label: index of the first wrong step, −1 when every step is right.
    generator: the model that wrote the solution ("" if not given).
    final_answer_correct: as given, or None.
    where: "FILE:LINE" / "FILE: item N" / "FILE: row N", for errors.
  """
  id: str
  problem: str
  steps: tuple
  label: int
  generator: str = ""
  final_answer_correct: Optional[bool] = None
  where: str = ""

  @property
  def question(self) -> str:
    """The prompt text (what `task.prompts` reads)."""
    return self.problem


def subset_name(path: str) -> str:
  """The subset a file holds: its stem ("data/gsm8k.jsonl" -> "gsm8k")."""
  base = os.path.basename(os.path.normpath(path))
  return base if os.path.isdir(path) else os.path.splitext(base)[0]


def _row(obj, where: str, position: int) -> Row:
  if not isinstance(obj, dict):
    raise errors.InputError(
        f"{where}: expected a JSON object, got {type(obj).__name__}.")
  missing = [k for k in ("problem", "steps", "label") if k not in obj]
  if missing:
    raise errors.InputError(f"{where}: missing field {missing[0]!r} (has "
                            f"{sorted(str(k) for k in obj)}).")
  problem, steps, label = obj["problem"], obj["steps"], obj["label"]
  if not isinstance(problem, str):
    raise errors.InputError(f"{where}: field 'problem' must be a string, got "
                            f"{type(problem).__name__}.")
  if (not isinstance(steps, (list, tuple)) or not steps or
      not all(isinstance(s, str) for s in steps)):
    raise errors.InputError(f"{where}: field 'steps' must be a non-empty "
                            f"list of strings, got {str(steps)[:80]!r}.")
  if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
    raise errors.InputError(f"{where}: field 'label' must be an integer, got "
                            f"{type(label).__name__}.")
  if not -1 <= int(label) < len(steps):
    raise errors.InputError(
        f"{where}: field 'label' = {label} is not −1 or a step index in "
        f"[0, {len(steps) - 1}] ({len(steps)} steps).")
  final = obj.get("final_answer_correct")
  if final is not None and not isinstance(final, bool):
    raise errors.InputError(f"{where}: field 'final_answer_correct' must be "
                            f"a boolean, got {type(final).__name__}.")
  generator = obj.get("generator") or ""
  return Row(id=str(obj.get("id", position)), problem=problem,
             steps=tuple(steps), label=int(label), generator=str(generator),
             final_answer_correct=final, where=where)


def read_file(path: str) -> list[Row]:
  """Every row of a ProcessBench file.

  Raises:
    errors.InputError naming the file and row of a malformed row (missing
    field, wrong type, a label outside −1..len(steps)−1), or the file when
    it holds no rows.
  """
  rows = [_row(obj, where, i) for i, (where, obj) in
          enumerate(readers.iter_rows(path, _COLUMNS))]
  if not rows:
    raise errors.InputError(f"{path}: no rows.")
  return rows


def write_file(path: str, rows: Sequence[dict]) -> None:
  """Writes ProcessBench rows (dicts of the layout above) as JSON lines."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  os.replace(path + ".tmp", path)


# --------------------------------------------------------------- metrics ---


def first_error_step_labels(labels, step_mask):
  """Step labels implied by first-error indices.

    y[b, k] = 1 if k < ℓ_b or ℓ_b = −1;  y[b, ℓ_b] = 0;
    m[b, k] = step_mask[b, k] and (ℓ_b = −1 or k ≤ ℓ_b)

  Args:
    labels: [B] first-error indices ℓ (−1: no error).
    step_mask: [B, S] valid steps.

  Returns:
    (y [B, S] int8 step labels, m [B, S] bool: the steps they cover).
  """
  labels = np.asarray(labels)[:, None]
  mask = np.asarray(step_mask, bool)
  k = np.arange(mask.shape[1])[None, :]
  known = mask & ((labels < 0) | (k <= labels))
  correct = (labels < 0) | (k < labels)
  return np.where(known, correct, 0).astype(np.int8), known


def file_metrics(step_scores, step_mask, labels,
                 threshold: float = DEFAULT_THRESHOLD) -> dict:
  """ProcessBench accuracies, F1 and first-error step AUROC of one file.

    p_b     = min{k : m[b, k] and s[b, k] ≤ τ}, or −1 if there is none
    acc_err = #{b : ℓ_b ≠ −1, p_b = ℓ_b} / #{b : ℓ_b ≠ −1}
    acc_cor = #{b : ℓ_b = −1, p_b = −1} / #{b : ℓ_b = −1}
    F1      = 2·acc_err·acc_cor / (acc_err + acc_cor)
    AUROC   = P(s⁺ > s⁻) + ½·P(s⁺ = s⁻)

  over the B solutions, with s⁺ / s⁻ the scores of right / wrong steps by
  `first_error_step_labels`.

  Args:
    step_scores: [B, S] step scores (P(step correct)).
    step_mask: [B, S] valid steps.
    labels: [B] first-error labels (−1: all steps correct).
    threshold: τ; step k is predicted wrong when s_k ≤ τ.

  Returns:
    dict with `acc_err`, `acc_cor`, `f1` (fractions; see the module
    docstring), `num_err`, `num_cor`, `threshold` and `auroc` (the
    probability that a correct step scores above a wrong one, ties ½, over
    the steps `first_error_step_labels` covers).
  """
  predictions = evaluation.first_error_predictions(step_scores, step_mask,
                                                   threshold)
  out = evaluation.processbench_metrics(labels, predictions)
  step_labels, known = first_error_step_labels(labels, step_mask)
  scores = np.asarray(step_scores, np.float64)
  out["auroc"] = evaluation.auroc(scores[known], step_labels[known])
  out["threshold"] = float(threshold)
  return out


# --------------------------------------------------------------- scoring ---


def _steps_of(row: Row, delimiter: str, inner_delimiter: str) -> tuple:
  steps = row.steps
  for k, step in enumerate(steps):
    if delimiter in step:
      if inner_delimiter == "space":
        steps = tuple(s.replace(delimiter, " ") for s in steps)
        break
      raise errors.InputError(
          f"{row.where}: step {k} contains the step delimiter "
          f"{delimiter!r}, so it would score as several steps; use a PRM "
          "trained with another task.delimiter, or inner_delimiter=space "
          f"(eval_prm --inner_delimiter=space): {step[:80]!r}.")
  if len(steps) > 1 and not steps[-1]:
    raise errors.InputError(f"{row.where}: the last step is empty.")
  return steps


def encode_rows(task, rows: Sequence[Row], *, max_prompt_len: int,
                inner_delimiter: str = "error"):
  """Prompt and response tokens of rows, as the policy would have them.

  Args:
    task: the run's task adapter (tokenizer, prompt format, delimiter).
    rows: ProcessBench rows.
    max_prompt_len: the longest prompt allowed (tokens, BOS included).
    inner_delimiter: "error" or "space" (see the module docstring).

  Returns:
    (prompt_ids, response_ids): lists of token lists; a response is the
    steps joined with the delimiter, then the end-of-turn token.

  Raises:
    errors.InputError naming the row of a prompt that does not fit, a text
    the tokenizer cannot encode, or steps holding the delimiter.
  """
  if inner_delimiter not in INNER_DELIMITER:
    raise ValueError(f"inner_delimiter must be one of {INNER_DELIMITER}, got "
                     f"{inner_delimiter!r}.")
  tokenizer = task.tokenizer
  prompt_ids, response_ids = [], []
  for row in rows:
    text = segmentation.join_steps(
        _steps_of(row, task.delimiter, inner_delimiter), task.delimiter)
    try:
      tokens, mask = tokenizer_lib.encode_prompts(
          tokenizer, task.prompts([row]), max_prompt_len)
      response = list(tokenizer.encode(text)) + [tokenizer.end_of_turn_id]
    except ValueError as e:
      raise errors.InputError(f"{row.where}: {e}") from None
    prompt_ids.append(labels_lib.response_rows(tokens, mask)[0])
    response_ids.append([int(t) for t in response])
  return prompt_ids, response_ids


def score_rows(task, scorer, rows: Sequence[Row], prompt_ids, response_ids,
               *, prompt_width: int, response_budget: int, num_steps: int,
               batch_rows: int) -> dict:
  """Step scores of encoded rows, in fixed-size batches (one shape).

  Args:
    task: the task adapter.
    scorer: a scorer with `score_batch` (`scoring.ModelScorer`).
    rows: the rows (for errors).
    prompt_ids: their prompt tokens (`encode_rows`).
    response_ids: their response tokens.
    prompt_width: P, prompt slots.
    response_budget: G, response slots.
    num_steps: S ≥ the longest row's steps.
    batch_rows: rows per scorer call.

  Returns:
    {"step_scores": [N, S], "step_mask": [N, S]} host arrays.

  Raises:
    errors.InputError naming a row whose tokens split into another number
    of steps than the row has (e.g. a tokenizer merging an empty step's
    delimiters into one token).
  """
  parts = []
  for start in range(0, len(rows), batch_rows):
    chunk = slice(start, start + batch_rows)
    batch = scoring.make_solution_batch(
        task, list(rows[chunk]), prompt_ids[chunk], response_ids[chunk],
        prompt_width=prompt_width, response_budget=response_budget,
        num_steps=num_steps, rows=batch_rows)
    count = len(rows[chunk])
    token_steps = np.asarray(batch.step_ids)[:count].max(axis=1) + 1
    for row, found in zip(rows[chunk], token_steps):
      if found != len(row.steps):
        raise errors.InputError(
            f"{row.where}: the tokens split into {found} steps at the "
            f"delimiter {task.delimiter!r}, the row has {len(row.steps)}.")
    result = scorer.score_batch(batch)
    parts.append({k: result[k][:count] for k in ("step_scores", "step_mask")})
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def export_row(row_id, problem: str, steps, label: int, *,
               generator: str = "",
               final_answer_correct: Optional[bool] = None) -> dict:
  """One ProcessBench row (a dict in the file layout)."""
  return {"id": str(row_id), "generator": generator, "problem": problem,
          "steps": list(steps), "label": int(label),
          "final_answer_correct": final_answer_correct}


def format_table(results: dict) -> str:
  """A markdown table of `{subset: file_metrics(...) + {"rows"}}`, with the
  mean F1 over subsets (ProcessBench's headline) when there are several."""
  lines = ["| subset | rows | erroneous | correct | acc_err | acc_cor | F1 "
           "| step AUROC | tau |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  pct = lambda x: "n/a" if x is None or np.isnan(x) else f"{100 * x:.1f}"
  for name, m in results.items():
    lines.append(
        f"| {name} | {m['num_err'] + m['num_cor']} | {m['num_err']} | "
        f"{m['num_cor']} | {pct(m['acc_err'])} | {pct(m['acc_cor'])} | "
        f"{pct(m['f1'])} | {pct(m['auroc'])} | {m['threshold']:.2f} |")
  if len(results) > 1:
    mean = float(np.mean([m["f1"] for m in results.values()]))
    lines.append(f"| mean F1 | | | | | | {pct(mean)} | | |")
  return "\n".join(lines)
