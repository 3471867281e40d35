"""reasoning-gym tasks as question/answer records with a 0/1 scorer.

Any of reasoning-gym's procedural datasets (`reasoning_gym.factory.DATASETS`,
offline and deterministic) can be used by name. Its own `score_answer` scores
responses; it gives partial credit to some wrong answers (e.g. 0.125 for a
wrong chain sum), so scores are thresholded to 0/1.

`chain_sum` and `basic_arithmetic` entries whose expression is a +/- chain of
non-negative integers with non-negative running values can be turned into an
arithmetic `Problem`, which gives them ground-truth step labels through
`arith.check_solution`.

reasoning-gym is imported on first use (it takes seconds to import).
"""

import dataclasses
import difflib
import re
from typing import Any, Optional, Sequence

from rl_rewards.tasks import arith
from rl_rewards.tasks import verifiers

_CHAIN_RE = re.compile(r"[0-9]{1,9}(?:[+-][0-9]{1,9})*")
_CHAIN_TOKEN_RE = re.compile(r"[+-]|[0-9]+")


def dataset_names() -> list[str]:
  """Names of all reasoning-gym datasets."""
  from reasoning_gym import factory  # pylint: disable=g-import-not-at-top
  return sorted(factory.DATASETS)


def create_dataset(name: str, size: int, seed: int, **config):
  """`reasoning_gym.create_dataset` with a clear error for unknown names."""
  import reasoning_gym  # pylint: disable=g-import-not-at-top
  names = dataset_names()
  if name not in names:
    close = difflib.get_close_matches(name, names, n=5)
    raise ValueError(
        f"unknown reasoning-gym dataset {name!r}; close names: {close} "
        f"({len(names)} datasets, see reasoning_gym.factory.DATASETS).")
  if size < 1:
    raise ValueError(f"size must be >= 1, got {size}.")
  return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
  """One reasoning-gym example.

  Attributes:
    question: the prompt text.
    answer: the gold answer text.
    index: the example's index in its dataset.
    entry: the full reasoning-gym entry (question, answer, metadata), as
      `score_answer` needs it.
  """
  question: str
  answer: str
  index: int
  entry: dict


class ReasoningGymTask:
  """A fixed-size, seeded reasoning-gym dataset with a thresholded scorer.

  Attributes:
    name: the dataset name.
    size: number of examples.
    seed: the dataset seed.
    threshold: a response scores 1 iff `score_answer` >= threshold.
  """

  def __init__(self, name: str, size: int, seed: int = 0,
               threshold: float = 1.0, **config):
    self.name = name
    self.size = size
    self.seed = seed
    self.threshold = threshold
    self.dataset = create_dataset(name, size, seed, **config)

  def __len__(self) -> int:
    return self.size

  def record(self, index: int) -> TaskRecord:
    if not 0 <= index < self.size:
      raise ValueError(
          f"index {index} out of range for {self.name} of size {self.size}.")
    entry = self.dataset[index]
    return TaskRecord(question=str(entry["question"]),
                      answer=str(entry["answer"]), index=index, entry=entry)

  def score(self, answer: Optional[str], index: int,
            max_chars: int = verifiers.DEFAULT_MAX_CHARS) -> float:
    """0/1 score of one answer, in this process.

    For untrusted model output in bulk, prefer `score_batch`, which adds a
    time limit per call.

    Args:
      answer: the extracted answer text (None scores 0).
      index: the example index.
      max_chars: longer answers score 0.

    Returns:
      1.0 or 0.0.
    """
    if answer is None or len(answer) > max_chars:
      return 0.0
    try:
      score = self.dataset.score_answer(answer, self.dataset[index])
    except Exception:  # pylint: disable=broad-except
      return 0.0
    return float(score is not None and score >= self.threshold)

  def score_batch(self, answers: Sequence[Optional[str]],
                  indices: Sequence[int], **kwargs):
    """0/1 scores of many answers in the verifier pool.

    Args:
      answers: N answers.
      indices: N example indices.
      **kwargs: passed to `verifiers.verify_batch` (timeout_s, pool, ...).

    Returns:
      (scores float32 [N], VerifierStats).
    """
    entries = [self.dataset[int(i)] for i in indices]
    return verifiers.verify_batch("reasoning_gym", answers, entries,
                                  threshold=self.threshold, **kwargs)


def expression_to_problem(expression: str, *, fixed_width: bool = True,
                          operand_width: Optional[int] = None,
                          value_width: Optional[int] = None
                          ) -> Optional[arith.Problem]:
  """An arithmetic `Problem` for a +/- chain like "12 + 7 - 3", else None.

  Args:
    expression: the expression; spaces are ignored.
    fixed_width: zero-pad numbers in the problem's surface format.
    operand_width: digits of operands; default the widest number in the
      expression.
    value_width: digits of running values; default the widest running value.

  Returns:
    The problem, or None if the expression is not a chain of k >= 1
    additions/subtractions of non-negative integers whose running values
    stay non-negative.
  """
  compact = expression.replace(" ", "")
  if len(compact) > 1000 or not _CHAIN_RE.fullmatch(compact):
    return None
  tokens = _CHAIN_TOKEN_RE.findall(compact)
  if len(tokens) < 3:
    return None
  first = int(tokens[0])
  ops, operands = tokens[1::2], [int(t) for t in tokens[2::2]]
  values = [first]
  for op, b in zip(ops, operands):
    values.append(values[-1] + b if op == "+" else values[-1] - b)
  if min(values) < 0:
    return None
  if operand_width is None:
    operand_width = max(len(str(x)) for x in [first] + operands)
  if value_width is None:
    value_width = max(len(str(v)) for v in values)
  return arith.problem_from_chain(
      first, ops, operands, fixed_width=fixed_width,
      operand_width=operand_width, value_width=value_width)


def entry_to_problem(entry: dict[str, Any], **format_kwargs
                     ) -> Optional[arith.Problem]:
  """Converts a chain_sum / basic_arithmetic entry to a `Problem`, or None.

  Args:
    entry: a reasoning-gym entry with `metadata.expression`.
    **format_kwargs: passed to `expression_to_problem`.

  Returns:
    The problem (whose answer equals the entry's), or None when the entry is
    not a convertible +/- chain.
  """
  metadata = entry.get("metadata") or {}
  expression = metadata.get("expression")
  if not isinstance(expression, str):
    return None
  problem = expression_to_problem(expression, **format_kwargs)
  if problem is None or str(problem.answer) != str(entry.get("answer")):
    return None
  return problem
