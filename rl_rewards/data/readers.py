"""Question/answer data files: format dispatch, field mapping and presets.

One reader for every file a text task takes (`config.task.train_path`,
`config.task.eval_path`, each entry of `config.eval.sets`). The format
follows the path:

  *.jsonl        one JSON object a line (blank lines skipped)
  *.json         a top-level list of objects, or one object a line
  *.parquet      a Parquet file, read a row group at a time (pyarrow)
  a directory    every *.parquet file in it, in name order (shards)

A `FieldMap` says where the question, the final answer and the reference
solution live in a row: dotted paths into nested objects
(`reward_model.ground_truth`, `extra_info.question`, `prompt.0.content` for
the first element of a list), and how the final answer is obtained:

  answer_from="field"   the value at `answer` (a string or an integer)
  answer_from="marker"  the text after the last "####" of the value at
                        `answer` (GSM8K)
  answer_from="boxed"   the last \\boxed{...} of the value at `solution`
                        (MATH)

A key is matched exactly, or else case-insensitively when exactly one key of
the row matches (`Problem`/`Answer` of the AIME-2024 exports read with the
`aime` preset). `PRESETS` names the common layouts:

  gsm8k       question, answer "... #### x" (solution: the whole answer)
  math        problem, solution with \\boxed{x}
  math500     problem, solution, answer
  deepscaler  problem, answer, solution
  aime        problem, answer (no solution: no SFT); aliases aime24, aime25

Every record has the fields all data sources share:

  question: str   the prompt text
  answer: str     the final answer ("72", "\\frac{1}{2}")
  solution: str   the reference solution ("" when the layout has none)
  index: int      position of the record in the file (or the shards)

A malformed file fails with an `errors.InputError` (a ValueError) naming the
file and the row: `FILE:LINE` (1-based) for JSON lines, `FILE: item N` for
a JSON list and `FILE: row N` for Parquet (0-based, within the shard), and
the field that is missing, of the wrong type, or without its answer.
"""

import dataclasses
import glob
import hashlib
import json
import os
from typing import Any, Iterator, Optional

from rl_rewards import errors
from rl_rewards.tasks import answers

ANSWER_FROM = ("field", "marker", "boxed")
FIELD_KEYS = ("question", "answer", "solution", "answer_from")
# Rows per pyarrow record batch (a row group is read in such slices).
_PARQUET_BATCH_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """Where a row keeps its question, answer and solution (dotted paths).

  Attributes:
    question: path of the question text.
    answer: path of the answer ("" when the answer comes from the solution).
    solution: path of the reference solution ("": the layout has none).
    answer_from: field | marker | boxed (see the module docstring).
  """
  question: str
  answer: str = ""
  solution: str = ""
  answer_from: str = "field"

  @property
  def has_solution(self) -> bool:
    return bool(self.solution)

  def check(self) -> None:
    """Raises ValueError when the map cannot produce a record."""
    if not self.question:
      raise ValueError("question: needs a path.")
    if self.answer_from not in ANSWER_FROM:
      raise ValueError(f"answer_from: must be one of {ANSWER_FROM}, got "
                       f"{self.answer_from!r}.")
    if self.answer_from in ("field", "marker") and not self.answer:
      raise ValueError(f"answer: answer_from={self.answer_from} needs the "
                       "path of the answer.")
    if self.answer_from == "boxed" and not self.solution:
      raise ValueError("solution: answer_from=boxed needs the path of the "
                       "solution.")


PRESETS = {
    "gsm8k": FieldMap("question", "answer", "answer", "marker"),
    "math": FieldMap("problem", "", "solution", "boxed"),
    "math500": FieldMap("problem", "answer", "solution", "field"),
    "deepscaler": FieldMap("problem", "answer", "solution", "field"),
    "aime": FieldMap("problem", "answer", "", "field"),
}
PRESET_ALIASES = {"aime24": "aime", "aime25": "aime", "aime2024": "aime",
                  "aime2025": "aime", "aime_2024": "aime", "aime_2025": "aime"}


def preset_name(name: str) -> Optional[str]:
  """The preset `name` refers to (case-insensitive, aliases), or None."""
  name = name.strip().lower()
  name = PRESET_ALIASES.get(name, name)
  return name if name in PRESETS else None


def field_map(preset: str, overrides: str = "") -> FieldMap:
  """The field map of a preset with `key=path` overrides applied.

  Args:
    preset: a name of `PRESETS` (or an alias, any case).
    overrides: "key=value,..." with keys question, answer, solution (dotted
      paths; an empty value unmaps answer or solution) and answer_from.

  Returns:
    The checked FieldMap.

  Raises:
    ValueError: an unknown preset or key, or a map that cannot produce
      records (the message names the part at fault).
  """
  name = preset_name(preset)
  if name is None:
    raise ValueError(f"unknown preset {preset!r}; one of "
                     f"{sorted(PRESETS) + sorted(PRESET_ALIASES)}.")
  values = apply_overrides(dataclasses.asdict(PRESETS[name]), overrides,
                           FIELD_KEYS)
  fields = FieldMap(**values)
  fields.check()
  return fields


def apply_overrides(values: dict, overrides: str, keys, note: str = ""
                    ) -> dict:
  """`values` with the "key=path,..." entries of `overrides` applied.

  Raises:
    ValueError: an entry without "=" or with a key not in `keys` (`note`,
      e.g. the preset, is added to the message).
  """
  values = dict(values)
  for item in overrides.split(","):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or key not in keys:
      raise ValueError(f"bad entry {item!r}; expected KEY=PATH with KEY one "
                       f"of {tuple(keys)}{note}.")
    values[key] = value.strip()
  return values


# --------------------------------------------------------------- formats --


def iter_json_lines(path: str):
  """Yields ("file:line", object) for each non-blank line of a JSONL file.

  Invalid UTF-8 or JSON (including a last line cut off mid-record) fails
  with an `errors.InputError` (a ValueError) naming the file and 1-based
  line.
  """
  with open(path, "rb") as f:
    for line_number, raw in enumerate(f, start=1):
      where = f"{path}:{line_number}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise errors.InputError(
            f"{where}: not UTF-8 (byte {e.start + 1} of the line: "
            f"{raw[e.start:e.start + 1]!r}).") from None
      if not line.strip():
        continue
      try:
        yield where, json.loads(line)
      except json.JSONDecodeError as e:
        raise errors.InputError(f"{where}: invalid JSON ({e.msg}).") from None


def _iter_json_file(path: str):
  """A `.json` file: a top-level list of objects, or one object a line."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise errors.InputError(f"{path}: not UTF-8 (byte {e.start + 1})."
                            ) from None
  stripped = text.lstrip()
  if not stripped.startswith("["):
    if stripped.startswith("{") and "\n" in stripped.strip():
      try:
        whole = json.loads(text)
      except json.JSONDecodeError:
        whole = None
      if isinstance(whole, dict):
        raise errors.InputError(
            f"{path}: the top level is a JSON object (keys "
            f"{sorted(whole)[:8]}); expected a list of records, or one "
            "record a line.")
    yield from iter_json_lines(path)
    return
  try:
    items = json.loads(text)
  except json.JSONDecodeError as e:
    raise errors.InputError(f"{path}:{e.lineno}: invalid JSON ({e.msg})."
                            ) from None
  for i, item in enumerate(items):
    yield f"{path}: item {i}", item


def parquet_files(path: str) -> list[str]:
  """The Parquet files of `path`: itself, or a directory's *.parquet shards."""
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    if not files:
      raise errors.InputError(f"{path}: a directory without *.parquet files.")
    return files
  return [path]


def _resolve_key(keys, key: str) -> Optional[str]:
  """`key`, or the one key of `keys` equal to it ignoring case, or None."""
  if key in keys:
    return key
  matches = [k for k in keys if isinstance(k, str) and k.lower() == key.lower()]
  return matches[0] if len(matches) == 1 else None


def _iter_parquet(path: str, columns: Optional[set] = None):
  """Rows of Parquet files as dicts, one record batch at a time."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  for shard in parquet_files(path):
    try:
      parquet = pq.ParquetFile(shard)
      names = parquet.schema_arrow.names
      wanted = None
      if columns is not None:
        resolved = {_resolve_key(names, c) for c in columns}
        # With a field missing, every column is read, so that the error
        # lists what the rows have.
        wanted = None if None in resolved else sorted(resolved)
      row = 0
      for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS,
                                        columns=wanted):
        for obj in batch.to_pylist():
          yield f"{shard}: row {row}", obj
          row += 1
    except (pa.ArrowException, OSError) as e:
      if isinstance(e, FileNotFoundError):
        raise errors.InputError(f"{shard}: file not found.") from None
      raise errors.InputError(f"{shard}: not a readable Parquet file ({e})."
                              ) from None


def iter_rows(path: str, columns: Optional[set] = None
              ) -> Iterator[tuple[str, Any]]:
  """Yields (where, row) for each row of a data file, in file order.

  Args:
    path: a .jsonl, .json or .parquet file, or a directory of .parquet
      shards.
    columns: top-level keys a Parquet read may restrict itself to (matched
      as the field paths are); None reads every column.

  Raises:
    errors.InputError naming the file (and line) when it does not exist, has
    an unknown extension or cannot be parsed.
  """
  if os.path.isdir(path):
    yield from _iter_parquet(path, columns)
    return
  if not os.path.isfile(path):
    raise errors.InputError(f"{path}: file not found.")
  extension = os.path.splitext(path)[1].lower()
  if extension == ".jsonl":
    yield from iter_json_lines(path)
  elif extension == ".json":
    yield from _iter_json_file(path)
  elif extension == ".parquet":
    yield from _iter_parquet(path, columns)
  else:
    raise errors.InputError(
        f"{path}: unknown data format {extension or '(no extension)'!r}; "
        "expected .jsonl, .json, .parquet or a directory of .parquet files.")


# ---------------------------------------------------------------- fields --


_MISSING = object()


def _lookup(row: Any, path: str) -> Any:
  """The value at a dotted path, or _MISSING."""
  value = row
  for part in path.split("."):
    if isinstance(value, dict):
      key = _resolve_key(value, part)
      if key is None:
        return _MISSING
      value = value[key]
    elif isinstance(value, list) and part.lstrip("-").isdigit():
      index = int(part)
      if not -len(value) <= index < len(value):
        return _MISSING
      value = value[index]
    else:
      return _MISSING
  return value


def field(row: Any, path: str, where: str) -> Any:
  """The value at a dotted path of `row`; InputError naming `where` and the
  row's keys when it is missing."""
  value = _lookup(row, path)
  if value is _MISSING:
    raise errors.InputError(f"{where}: missing field {path!r} (has "
                            f"{sorted(str(k) for k in row)}).")
  return value


def _text(row: dict, path: str, name: str, where: str, *,
          allow_int: bool = False) -> str:
  value = _lookup(row, path)
  field = repr(path) if path == name else f"{path!r} (the {name})"
  if value is _MISSING:
    what = "" if path == name else f"the {name}; "
    raise errors.InputError(f"{where}: missing field {path!r} ({what}has "
                            f"{sorted(str(k) for k in row)}).")
  if allow_int and isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if not isinstance(value, str):
    kind = "null" if value is None else type(value).__name__
    allowed = "a string or an integer" if allow_int else "a string"
    raise errors.InputError(f"{where}: field {field} must be {allowed}, got "
                            f"{kind}.")
  return value


def make_record(row: Any, fields: FieldMap, where: str) -> dict:
  """The question, answer and solution of one row (index not set).

  Raises:
    errors.InputError naming `where` and the field at fault.
  """
  if not isinstance(row, dict):
    raise errors.InputError(
        f"{where}: expected a JSON object, got {type(row).__name__}.")
  question = _text(row, fields.question, "question", where)
  solution = (_text(row, fields.solution, "solution", where)
              if fields.solution else "")
  if fields.answer_from == "boxed":
    boxed = answers.last_boxed(solution)
    if boxed is None:
      raise errors.InputError(
          f"{where}: field {fields.solution!r} has no closed \\boxed{{...}} "
          f"answer: {solution[-80:]!r}.")
    answer = boxed.strip()
  elif fields.answer_from == "marker":
    text = _text(row, fields.answer, "answer", where)
    if answers.GSM8K_MARKER + " " not in text:
      raise errors.InputError(
          f"{where}: field {fields.answer!r} has no '#### ' final answer: "
          f"{text[-80:]!r}.")
    answer = answers.gsm8k_final_answer(text)
    if not answer:
      raise errors.InputError(
          f"{where}: the final answer after '#### ' is empty.")
  else:
    answer = _text(row, fields.answer, "answer", where, allow_int=True).strip()
    if not answer:
      raise errors.InputError(f"{where}: field {fields.answer!r} (the "
                              "answer) is empty.")
  return {"question": question, "answer": answer, "solution": solution}


def _columns(fields: FieldMap) -> set:
  return {p.split(".")[0] for p in (fields.question, fields.answer,
                                    fields.solution) if p}


def read_records(path: str, fields: FieldMap) -> list[dict]:
  """Every record of a data file (see the module docstring).

  Args:
    path: a .jsonl, .json or .parquet file or a directory of shards.
    fields: where the question, answer and solution are.

  Returns:
    Records with question, answer, solution and index.

  Raises:
    errors.InputError naming the file and row of the first bad row, or the
    file when it holds no records.
  """
  records = []
  for where, row in iter_rows(path, _columns(fields)):
    record = make_record(row, fields, where)
    record["index"] = len(records)
    records.append(record)
  if not records:
    raise errors.InputError(f"{path}: no records.")
  return records


def check_first_record(path: str, fields: FieldMap) -> dict:
  """Reads only the first row of a data file and maps its fields.

  The check a config gets before any work: the path exists, has a known
  format, and the first row has every field of `fields`.

  Returns:
    The first record.
  """
  for where, row in iter_rows(path, _columns(fields)):
    record = make_record(row, fields, where)
    record["index"] = 0
    return record
  raise errors.InputError(f"{path}: no records.")


def fingerprint(path: str) -> bytes:
  """A digest of a data file's bytes (of every shard of a directory)."""
  digest = hashlib.sha256()
  files = parquet_files(path) if os.path.isdir(path) else [path]
  for name in files:
    digest.update(os.path.basename(name).encode() + b"\0")
    with open(name, "rb") as f:
      for chunk in iter(lambda f=f: f.read(1 << 20), b""):
        digest.update(chunk)
  return digest.digest()
