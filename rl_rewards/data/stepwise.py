"""Step-labelled solutions from files: the layouts a PRM is trained from.

A PRM trained with `prm.data="file"` reads `prm.train_path` (and
`prm.valid_path`) through `rl_rewards.data.readers` (.jsonl, .json,
.parquet, or a directory of .parquet shards, read a batch at a time). Each
row is one solution of one question, with a label for every step. Two
layouts (`prm.preset`):

  trl            TRL's stepwise supervision: `prompt` (str), `completions`
                 (list of step strings), `labels` (one per step)
  math_shepherd  Math-Shepherd's original rows: `input` is the question and
                 the solution with the step tag "ки" after every step,
                 `label` the same text with each tag replaced by "+" (a good
                 step) or "-" (a bad one)

Step labels (`labels` of the trl layout) are booleans, the integers 0 / 1,
or soft labels: floats in [0, 1] (e.g. a Monte-Carlo estimate of the
probability that the step leads to a correct answer). A label y gives the
record's soft label q = y and its hard label 1[y >= 1/2]. A separate field
of soft labels (`soft_labels=PATH` in `prm.fields`, floats in [0, 1], one
per step) takes the place of q, the hard labels then coming from `labels`.
`prm.target=soft` trains on q, `prm.target=hard` on the hard labels; for
boolean labels the two agree. The outcome of a solution (what an implicit
PRM is trained on) is the field `outcome=PATH` when mapped (a boolean, 0/1
or a float in [0, 1]), else 1 when every hard step label is 1.

Math-Shepherd's `input` holds the question and the first step in one
piece: the solution starts at its first "Step 1:" (any case); a row
without one starts after the first piece's last "?". A tag before that
point (an annotation slip inside the question) is dropped with its label.

`prm.fields` renames fields like `task.fields` does ("key=path,...",
dotted paths into nested rows): keys prompt, completions, labels,
soft_labels and outcome for trl, input and label for math_shepherd.

Steps are joined with the task's step delimiter by the one segmenter
(`rl_rewards.tasks.segmentation.join_steps`), so a step must neither be
empty (or only whitespace) nor contain the delimiter: it would not be one
step when the trained PRM scores a rollout. Every malformed row fails with
an `errors.InputError` naming the file and the row (`FILE:LINE` for JSON
lines, `FILE: item N` for a JSON list, `FILE: row N` for Parquet) and the
field at fault.
"""

import dataclasses
import math
import re
from typing import Iterator

from rl_rewards import errors
from rl_rewards.data import readers
from rl_rewards.tasks import segmentation

LAYOUTS = ("trl", "math_shepherd")
# The field keys `prm.fields` may rename, by layout; "" = not mapped.
FIELD_KEYS = {"trl": ("prompt", "completions", "labels", "soft_labels",
                      "outcome"),
              "math_shepherd": ("input", "label")}
MATH_SHEPHERD_TAG = "ки"
_FIRST_STEP_RE = re.compile(r"step 1:", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class StepwiseFields:
  """Where a row keeps its prompt, steps and labels (dotted paths).

  Attributes:
    layout: "trl" or "math_shepherd".
    prompt, completions, labels: the trl layout's fields.
    soft_labels: trl: a separate field of soft step labels ("": none).
    outcome: trl: the solution's outcome ("": derived from the labels).
    input, label: the math_shepherd layout's tagged and labelled texts.
  """
  layout: str
  prompt: str = ""
  completions: str = ""
  labels: str = ""
  soft_labels: str = ""
  outcome: str = ""
  input: str = ""
  label: str = ""

  def paths(self) -> tuple:
    return tuple(p for p in (getattr(self, k) for k in FIELD_KEYS[self.layout])
                 if p)


PRESETS = {
    "trl": StepwiseFields("trl", prompt="prompt", completions="completions",
                          labels="labels"),
    "math_shepherd": StepwiseFields("math_shepherd", input="input",
                                    label="label"),
}
_REQUIRED = {"trl": ("prompt", "completions", "labels"),
             "math_shepherd": ("input", "label")}


def field_map(preset: str = "", overrides: str = "") -> StepwiseFields:
  """The fields of a preset ("" = trl) with `key=path` renames applied.

  Raises:
    ValueError: an unknown preset or key, or a required field unmapped
      (the message names the part at fault).
  """
  name = preset.strip().lower() or "trl"
  if name not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; one of {sorted(PRESETS)}.")
  values = readers.apply_overrides(dataclasses.asdict(PRESETS[name]),
                                   overrides, FIELD_KEYS[name],
                                   f" (preset {name})")
  for key in _REQUIRED[name]:
    if not values[key]:
      raise ValueError(f"{key}: the {name} layout needs its path.")
  return StepwiseFields(**values)


# ------------------------------------------------------------------ rows --


def _label_value(value, where: str, what: str) -> float:
  """A step label or outcome: bool, 0/1, or a finite float in [0, 1]."""
  if isinstance(value, bool):
    return float(value)
  if isinstance(value, (int, float)) and (
      isinstance(value, int) and value in (0, 1) or
      isinstance(value, float) and math.isfinite(value) and
      0.0 <= value <= 1.0):
    return float(value)
  kind = "null" if value is None else f"{type(value).__name__} {value!r}"
  raise errors.InputError(f"{where}: {what} must be a bool, 0 / 1 or a "
                          f"number in [0, 1], got {kind}.")


def _label_list(value, path: str, count: int, where: str) -> list[float]:
  if not isinstance(value, list):
    raise errors.InputError(f"{where}: field {path!r} must be a list, got "
                            f"{type(value).__name__}.")
  if len(value) != count:
    raise errors.InputError(f"{where}: field {path!r} has {len(value)} "
                            f"labels for {count} steps.")
  return [_label_value(v, where, f"{path}[{k}]") for k, v in enumerate(value)]


def _check_steps(steps, path: str, where: str, delimiter: str):
  if not isinstance(steps, list) or not steps:
    kind = "an empty list" if isinstance(steps, list) else type(
        steps).__name__
    raise errors.InputError(f"{where}: field {path!r} must be a non-empty "
                            f"list of step strings, got {kind}.")
  for k, step in enumerate(steps):
    if not isinstance(step, str):
      raise errors.InputError(f"{where}: {path}[{k}] must be a string, got "
                              f"{type(step).__name__}.")
    if not step.strip():
      raise errors.InputError(f"{where}: {path}[{k}] is an empty step.")
    if delimiter in step:
      raise errors.InputError(
          f"{where}: {path}[{k}] contains the step delimiter "
          f"{delimiter!r} (config.task.delimiter), so it would not be one "
          f"step when the PRM scores a solution: {step[:80]!r}.")


def _trl_example(row, fields: StepwiseFields, where: str, delimiter: str):
  prompt = readers.field(row, fields.prompt, where)
  if not isinstance(prompt, str) or not prompt.strip():
    raise errors.InputError(f"{where}: field {fields.prompt!r} must be a "
                            "non-empty string.")
  steps = readers.field(row, fields.completions, where)
  _check_steps(steps, fields.completions, where, delimiter)
  labels = _label_list(readers.field(row, fields.labels, where), fields.labels,
                       len(steps), where)
  q = (_label_list(readers.field(row, fields.soft_labels, where), fields.soft_labels,
                   len(steps), where) if fields.soft_labels else labels)
  hard = [int(y >= 0.5) for y in labels]
  outcome = (_label_value(readers.field(row, fields.outcome, where), where,
                          f"field {fields.outcome!r}") if fields.outcome
             else float(all(hard)))
  return {"prompt": prompt, "steps": list(steps), "q": q, "hard": hard,
          "outcome": outcome}


def _math_shepherd_example(row, fields: StepwiseFields, where: str,
                           delimiter: str):
  text, labelled = (readers.field(row, fields.input, where),
                    readers.field(row, fields.label, where))
  for path, value in ((fields.input, text), (fields.label, labelled)):
    if not isinstance(value, str):
      raise errors.InputError(f"{where}: field {path!r} must be a string, "
                              f"got {type(value).__name__}.")
  pieces = text.split(MATH_SHEPHERD_TAG)
  if len(pieces) < 2:
    raise errors.InputError(f"{where}: field {fields.input!r} has no step "
                            f"tag {MATH_SHEPHERD_TAG!r}.")
  # `label` is `input` with every tag replaced by one "+" or "-".
  marks, position = [], 0
  for k, piece in enumerate(pieces):
    if not labelled.startswith(piece, position):
      raise errors.InputError(
          f"{where}: field {fields.label!r} differs from {fields.input!r} "
          f"outside the step tags (before tag {k}).")
    position += len(piece)
    if k < len(pieces) - 1:
      mark = labelled[position:position + 1]
      if mark not in ("+", "-"):
        raise errors.InputError(
            f"{where}: field {fields.label!r} has {mark!r} where "
            f"{fields.input!r} has tag {k}; expected '+' or '-'.")
      marks.append(mark == "+")
      position += 1
  if position != len(labelled):
    raise errors.InputError(f"{where}: field {fields.label!r} is longer "
                            f"than {fields.input!r} with its tags replaced.")
  if pieces[-1].strip():
    raise errors.InputError(f"{where}: field {fields.input!r} has text "
                            f"after its last step tag: {pieces[-1][:80]!r}.")
  pieces = pieces[:-1]
  first = next((k for k, piece in enumerate(pieces)
                if _FIRST_STEP_RE.search(piece)), None)
  if first is not None:
    start = _FIRST_STEP_RE.search(pieces[first]).start()
  elif "?" in pieces[0] and pieces[0].rpartition("?")[2].strip():
    first, start = 0, pieces[0].rindex("?") + 1
  else:
    raise errors.InputError(
        f"{where}: field {fields.input!r}: no 'Step 1:' and no '?' ends the "
        "question, so the first step cannot be told from it.")
  prompt = ("".join(pieces[:first]) + pieces[first][:start]).strip()
  steps = [pieces[first][start:].strip()] + [p.strip()
                                            for p in pieces[first + 1:]]
  if not prompt:
    raise errors.InputError(f"{where}: field {fields.input!r} has no "
                            "question before its first step.")
  _check_steps(steps, f"{fields.input} steps", where, delimiter)
  hard = [int(m) for m in marks[first:]]
  return {"prompt": prompt, "steps": steps, "q": [float(h) for h in hard],
          "hard": hard, "outcome": float(all(hard))}


def parse_row(row, fields: StepwiseFields, where: str,
              delimiter: str = segmentation.DEFAULT_DELIMITER) -> dict:
  """One row -> {prompt, steps, q, hard, outcome} (see the module docstring).

  Args:
    row: the row (a dict).
    fields: its layout and field paths.
    where: the file and row, for errors.
    delimiter: the task's step delimiter.

  Returns:
    dict with `prompt` (str), `steps` (K strings), `q` (K soft labels in
    [0, 1]), `hard` (K ints 0 / 1) and `outcome` (float in [0, 1]).

  Raises:
    errors.InputError naming `where` and the field at fault.
  """
  if not isinstance(row, dict):
    raise errors.InputError(
        f"{where}: expected an object, got {type(row).__name__}.")
  if fields.layout == "math_shepherd":
    return _math_shepherd_example(row, fields, where, delimiter)
  return _trl_example(row, fields, where, delimiter)


def iter_examples(path: str, fields: StepwiseFields,
                  delimiter: str = segmentation.DEFAULT_DELIMITER
                  ) -> Iterator[tuple[str, dict]]:
  """Yields (where, `parse_row` dict) for every row of a file, in order."""
  columns = {p.split(".")[0] for p in fields.paths()}
  for where, row in readers.iter_rows(path, columns):
    yield where, parse_row(row, fields, where, delimiter)


def read_examples(path: str, fields: StepwiseFields,
                  delimiter: str = segmentation.DEFAULT_DELIMITER
                  ) -> list[tuple[str, dict]]:
  """Every row of a file as (where, example); an empty file is an error."""
  examples = list(iter_examples(path, fields, delimiter))
  if not examples:
    raise errors.InputError(f"{path}: no rows.")
  return examples


def check_first_example(path: str, fields: StepwiseFields,
                        delimiter: str = segmentation.DEFAULT_DELIMITER
                        ) -> dict:
  """Parses only the first row: the check a config gets before any work."""
  for _, example in iter_examples(path, fields, delimiter):
    return example
  raise errors.InputError(f"{path}: no rows.")
