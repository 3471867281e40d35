"""The GSM8K and MATH JSONL layouts, as presets of `rl_rewards.data.readers`.

`readers` reads every format and layout; these names remain for callers of
the two original layouts and of the JSON-lines iterator (the label store).
Records have question, answer, solution and index; a malformed file fails
with an `errors.InputError` naming the file and the 1-based line.
"""

from rl_rewards.data import readers

iter_json_lines = readers.iter_json_lines


def read_gsm8k_jsonl(path: str) -> list[dict]:
  """Reads GSM8K-format JSONL: fields `question` and `answer` ("... #### x").

  Args:
    path: the file.

  Returns:
    Records with question, answer (the text after "####"), solution (the
    full `answer` field) and index.
  """
  return readers.read_records(path, readers.PRESETS["gsm8k"])


def read_math_jsonl(path: str) -> list[dict]:
  """Reads MATH-format JSONL: fields `problem` and `solution` (\\boxed{x}).

  Args:
    path: the file.

  Returns:
    Records with question (the problem), answer (the last boxed content,
    braces matched), solution and index.
  """
  return readers.read_records(path, readers.PRESETS["math"])
