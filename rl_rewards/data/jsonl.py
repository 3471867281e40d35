"""Readers for GSM8K- and MATH-format JSONL files, with strict validation.

Both return a list of records with the fields every data source here shares:

  question: str   the prompt text
  answer: str     the final answer ("72", "\\frac{1}{2}")
  solution: str   the full reference solution
  index: int      position of the record in the file (blank lines skipped)

A malformed file fails with an `errors.InputError` (a ValueError) naming the
file and the 1-based line number: bytes that are not UTF-8, invalid JSON, a
missing or non-string field, a GSM8K answer without "#### ", a MATH solution
without a closed \\boxed{}.
"""

import json
import os
from typing import Callable

from rl_rewards import errors
from rl_rewards.tasks import answers


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


def _read_jsonl(path: str, required_fields: tuple[str, ...],
                make_record: Callable[[dict, str], dict]) -> list[dict]:
  if not os.path.isfile(path):
    raise errors.InputError(f"{path}: file not found.")
  records = []
  for where, obj in iter_json_lines(path):
    if not isinstance(obj, dict):
      raise errors.InputError(
          f"{where}: expected a JSON object, got {type(obj).__name__}.")
    for field in required_fields:
      if field not in obj:
        raise errors.InputError(f"{where}: missing field {field!r} "
                                f"(has {sorted(obj)}).")
      if not isinstance(obj[field], str):
        raise errors.InputError(
            f"{where}: field {field!r} must be a string, got "
            f"{type(obj[field]).__name__}.")
    record = make_record(obj, where)
    record["index"] = len(records)
    records.append(record)
  if not records:
    raise errors.InputError(f"{path}: no records.")
  return records


def _gsm8k_record(obj: dict, where: str) -> dict:
  solution = obj["answer"]
  if answers.GSM8K_MARKER + " " not in solution:
    raise errors.InputError(
        f"{where}: field 'answer' has no '#### ' final answer: "
        f"{solution[-80:]!r}.")
  final = answers.gsm8k_final_answer(solution)
  if not final:
    raise errors.InputError(
        f"{where}: the final answer after '#### ' is empty.")
  return {"question": obj["question"], "answer": final, "solution": solution}


def _math_record(obj: dict, where: str) -> dict:
  solution = obj["solution"]
  boxed = answers.last_boxed(solution)
  if boxed is None:
    raise errors.InputError(
        f"{where}: field 'solution' has no closed \\boxed{{...}} answer: "
        f"{solution[-80:]!r}.")
  return {"question": obj["problem"], "answer": boxed.strip(),
          "solution": solution}


def read_gsm8k_jsonl(path: str) -> list[dict]:
  """Reads GSM8K-format JSONL: fields `question` and `answer` ("... #### x").

  Args:
    path: the file.

  Returns:
    Records with question, answer (the text after "####"), solution (the
    full `answer` field) and index.
  """
  return _read_jsonl(path, ("question", "answer"), _gsm8k_record)


def read_math_jsonl(path: str) -> list[dict]:
  """Reads MATH-format JSONL: fields `problem` and `solution` (\\boxed{x}).

  Args:
    path: the file.

  Returns:
    Records with question (the problem), answer (the last boxed content,
    braces matched), solution and index.
  """
  return _read_jsonl(path, ("problem", "solution"), _math_record)
