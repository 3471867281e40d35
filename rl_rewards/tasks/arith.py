"""The embedded arithmetic task: chains of +/- with ground-truth step labels.

A problem is a chain `x0 op1 b1 op2 b2 ... opk bk` of k additions and
subtractions. The reference solution writes one step a line, each step using
the running value of the previous one, then the answer on a final line
starting with "#". In the default fixed-width format (operands 2 digits,
running values 3 digits), which a small model learns faster than
variable-width numbers (see docs/arith_task.md):

  question: "23+07-15="
  solution: "023+07=030\\n030-15=015\\n#015"

With `fixed_width=False` the same without zero padding: "23+7-15=" and
"23+7=30\\n30-15=15\\n#15".

Problems are a pure function of (seed, split, index): the generator is a numpy
`Generator` seeded from those three. The "train" split never contains a
problem of any other split (e.g. "eval", "test"): problems are assigned to
train or held-out by a hash of their content (1 in `HELDOUT_BUCKETS` is
held-out) and each split rejects the problems that are not its own.

The step checker (`check_solution`) gives every step of a response a label,
which makes this task a source of ground-truth process labels (an oracle PRM)
and of first-error indices (ProcessBench-style evaluation).
"""

import dataclasses
import re
import zlib
from typing import NamedTuple, Optional, Sequence

import numpy as np

from rl_rewards.tasks import segmentation

TRAIN_SPLIT = "train"
# One problem in HELDOUT_BUCKETS (by content hash) belongs to held-out splits.
HELDOUT_BUCKETS = 8
# Bounds that keep the checker's time per response small on any input.
_MAX_STEP_CHARS = 40
_MAX_GENERATION_ATTEMPTS = 10_000


@dataclasses.dataclass(frozen=True)
class ArithConfig:
  """Distribution and surface format of arithmetic problems.

  Defaults are the settings measured in docs/arith_task.md.

  Attributes:
    min_ops: minimum number k of operations (k is uniform in [min, max]).
    max_ops: maximum number of operations.
    first_min: smallest first number.
    first_max: largest first number.
    small_operand_prob: probability of drawing a small operand.
    small_operand_min: small operands are uniform in [small_min, small_max].
    small_operand_max: see small_operand_min.
    large_operand_min: other operands are uniform in [large_min, large_max].
    large_operand_max: see large_operand_min.
    max_value: running values stay in [0, max_value]; an operation that would
      leave the range is resampled.
    fixed_width: zero-pad operands and running values to fixed widths.
    seed: generator seed; problems are a function of (seed, split, index).
  """
  min_ops: int = 2
  max_ops: int = 6
  first_min: int = 1
  first_max: int = 99
  small_operand_prob: float = 0.3
  small_operand_min: int = 1
  small_operand_max: int = 9
  large_operand_min: int = 10
  large_operand_max: int = 99
  max_value: int = 199
  fixed_width: bool = True
  seed: int = 0

  def __post_init__(self):
    def fail(message):
      raise ValueError(f"ArithConfig: {message} (config: {self}).")
    if not 1 <= self.min_ops <= self.max_ops:
      fail("need 1 <= min_ops <= max_ops")
    if not 0 <= self.first_min <= self.first_max <= self.max_value:
      fail("need 0 <= first_min <= first_max <= max_value")
    if not 1 <= self.small_operand_min <= self.small_operand_max:
      fail("need 1 <= small_operand_min <= small_operand_max")
    if not 1 <= self.large_operand_min <= self.large_operand_max:
      fail("need 1 <= large_operand_min <= large_operand_max")
    if not 0.0 <= self.small_operand_prob <= 1.0:
      fail("small_operand_prob must be in [0, 1]")
    smallest = min(self.small_operand_min, self.large_operand_min)
    if self.max_value < 2 * smallest - 1:
      # Otherwise some running value admits no valid operation.
      fail("max_value must be >= 2 * (smallest operand) - 1")
    if self.seed < 0:
      fail("seed must be >= 0")

  @property
  def operand_width(self) -> int:
    return len(str(max(self.small_operand_max, self.large_operand_max,
                       self.first_max)))

  @property
  def value_width(self) -> int:
    return len(str(self.max_value))


@dataclasses.dataclass(frozen=True)
class Problem:
  """One arithmetic chain and its ground truth.

  Attributes:
    question: the prompt text, e.g. "23+07-15=".
    ops: the k operators, each "+" or "-".
    operands: the k operands b_1..b_k.
    values: the k + 1 true running values; values[0] is the first number,
      values[j + 1] = values[j] ops[j] operands[j].
    answer: values[-1].
    fixed_width: whether the surface format zero-pads numbers.
    operand_width: digits of operands (and the first number) in the question.
    value_width: digits of running values in the solution.
    split: the split the problem was generated for ("" if built by hand).
    index: its index in the split (-1 if built by hand).
  """
  question: str
  ops: tuple[str, ...]
  operands: tuple[int, ...]
  values: tuple[int, ...]
  answer: int
  fixed_width: bool = True
  operand_width: int = 2
  value_width: int = 3
  split: str = ""
  index: int = -1

  @property
  def num_ops(self) -> int:
    return len(self.ops)


def _pad(value: int, width: int, fixed_width: bool) -> str:
  if not fixed_width:
    return str(value)
  if value < 0:
    return "-" + str(-value).zfill(width)
  return str(value).zfill(width)


def _apply(value: int, op: str, operand: int) -> int:
  return value + operand if op == "+" else value - operand


def problem_from_chain(first: int, ops: Sequence[str],
                       operands: Sequence[int], *, fixed_width: bool = True,
                       operand_width: int = 2, value_width: int = 3,
                       split: str = "", index: int = -1) -> Problem:
  """Builds a `Problem` from its chain.

  Args:
    first: the first number (>= 0).
    ops: k >= 1 operators, each "+" or "-".
    operands: k operands (>= 0).
    fixed_width: zero-pad numbers in question and solution.
    operand_width: digits of the first number and operands in the question.
    value_width: digits of running values in the solution.
    split: provenance, stored in the problem.
    index: provenance, stored in the problem.

  Returns:
    The problem.

  Raises:
    ValueError: on an empty chain, an unknown operator, mismatched lengths,
      a negative number or a negative running value (the step format has no
      sign).
  """
  ops = tuple(ops)
  operands = tuple(int(b) for b in operands)
  if not ops or len(ops) != len(operands):
    raise ValueError(
        f"need k >= 1 ops and k operands, got ops={ops} operands={operands}.")
  if any(op not in ("+", "-") for op in ops):
    raise ValueError(f"ops must be '+' or '-', got {ops}.")
  if first < 0 or any(b < 0 for b in operands):
    raise ValueError(
        f"numbers must be >= 0, got first={first} operands={operands}.")
  values = [int(first)]
  for op, b in zip(ops, operands):
    values.append(_apply(values[-1], op, b))
  if min(values) < 0:
    raise ValueError(f"running values must stay >= 0, got {values}.")
  parts = [_pad(first, operand_width, fixed_width)]
  for op, b in zip(ops, operands):
    parts.append(op + _pad(b, operand_width, fixed_width))
  return Problem(question="".join(parts) + "=", ops=ops, operands=operands,
                 values=tuple(values), answer=values[-1],
                 fixed_width=fixed_width, operand_width=operand_width,
                 value_width=value_width, split=split, index=index)


def _content_bucket(first: int, ops, operands) -> int:
  key = str(first) + "".join(f"{op}{b}" for op, b in zip(ops, operands))
  return zlib.crc32(key.encode()) % HELDOUT_BUCKETS


def _problem_rng(seed: int, split: str, index: int) -> np.random.Generator:
  return np.random.default_rng(
      [seed, zlib.crc32(split.encode("utf-8")), index])


class _UniformStream:
  """Uniform [0, 1) draws from a Generator, fetched in blocks for speed."""

  def __init__(self, rng: np.random.Generator, block: int = 64):
    self._rng = rng
    self._block = block
    self._buffer = []

  def uniform(self) -> float:
    if not self._buffer:
      self._buffer = self._rng.random(self._block).tolist()[::-1]
    return self._buffer.pop()

  def integer(self, low: int, high: int) -> int:
    """Uniform integer in [low, high]."""
    return min(low + int(self.uniform() * (high - low + 1)), high)


def _sample_chain(cfg: ArithConfig, stream: _UniformStream):
  """Draws (first, ops, operands) from the config's distribution."""
  num_ops = stream.integer(cfg.min_ops, cfg.max_ops)
  first = stream.integer(cfg.first_min, cfg.first_max)
  value, ops, operands = first, [], []
  for _ in range(num_ops):
    for _ in range(1000):
      op = "+" if stream.uniform() < 0.5 else "-"
      if stream.uniform() < cfg.small_operand_prob:
        b = stream.integer(cfg.small_operand_min, cfg.small_operand_max)
      else:
        b = stream.integer(cfg.large_operand_min, cfg.large_operand_max)
      if 0 <= _apply(value, op, b) <= cfg.max_value:
        break
    else:  # Not reached for sane configs; keeps the loop bounded.
      b = min(cfg.small_operand_min, cfg.large_operand_min)
      op = "+" if value + b <= cfg.max_value else "-"
    ops.append(op)
    operands.append(b)
    value = _apply(value, op, b)
  return first, ops, operands


def make_problem(cfg: ArithConfig, index: int,
                 split: str = TRAIN_SPLIT) -> Problem:
  """The problem number `index` of `split`; a pure function of its inputs.

  Args:
    cfg: the task configuration.
    index: problem index, >= 0.
    split: split name; "train" and every other split are disjoint.

  Returns:
    The problem.
  """
  if index < 0:
    raise ValueError(f"index must be >= 0, got {index}.")
  if not isinstance(split, str) or not split:
    raise ValueError(f"split must be a non-empty string, got {split!r}.")
  stream = _UniformStream(_problem_rng(cfg.seed, split, index))
  want_heldout = split != TRAIN_SPLIT
  for _ in range(_MAX_GENERATION_ATTEMPTS):
    first, ops, operands = _sample_chain(cfg, stream)
    if (_content_bucket(first, ops, operands) == 0) == want_heldout:
      return problem_from_chain(
          first, ops, operands, fixed_width=cfg.fixed_width,
          operand_width=cfg.operand_width, value_width=cfg.value_width,
          split=split, index=index)
  raise ValueError(
      f"could not draw a problem for split {split!r} in "
      f"{_MAX_GENERATION_ATTEMPTS} attempts: the configuration {cfg} has too "
      "few distinct problems to keep train and held-out splits disjoint.")


def make_problems(cfg: ArithConfig, split: str, indices) -> list[Problem]:
  """`[make_problem(cfg, i, split) for i in indices]`."""
  return [make_problem(cfg, int(i), split) for i in indices]


def _step_line(a: int, op: str, b: int, c: int, problem: Problem) -> str:
  fixed, width = problem.fixed_width, problem.value_width
  operand = _pad(b, problem.operand_width, fixed)
  return f"{_pad(a, width, fixed)}{op}{operand}={_pad(c, width, fixed)}"


def _answer_line(value: int, problem: Problem) -> str:
  return "#" + _pad(value, problem.value_width, problem.fixed_width)


def reference_lines(problem: Problem) -> list[str]:
  """The reference solution as a list of steps (k arithmetic + answer)."""
  lines = [_step_line(problem.values[j], op, b, problem.values[j + 1], problem)
           for j, (op, b) in enumerate(zip(problem.ops, problem.operands))]
  lines.append(_answer_line(problem.answer, problem))
  return lines


def reference_solution(problem: Problem,
                       delimiter: str = segmentation.DEFAULT_DELIMITER) -> str:
  """The reference solution text, one step per line, no trailing delimiter."""
  return segmentation.join_steps(reference_lines(problem), delimiter)


# Character classes are explicit ([0-9], not \d, which matches other scripts'
# digits) and repetitions bounded, so matching is linear in a short line.
_STEP_RE = re.compile(r"([0-9]{1,9})([+-])([0-9]{1,9})=([0-9]{1,9})")
_ANSWER_RE = re.compile(r"#([0-9]{1,9})")


class StepLabels(NamedTuple):
  """Per-step verdicts of `check_solution`.

  Attributes:
    labels: one bool per step of the response (`segmentation.split_steps`).
    first_error: index of the first False label, -1 if every step is correct
      (which includes a correct but unfinished prefix of the solution).
    answer_correct: the last step is "#N" with N the true answer.
    num_steps: len(labels).
  """
  labels: list[bool]
  first_error: int
  answer_correct: bool
  num_steps: int


def _answer_value(step: str) -> Optional[int]:
  if len(step) > _MAX_STEP_CHARS:
    return None
  match = _ANSWER_RE.fullmatch(step)
  return int(match.group(1)) if match else None


def _step_correct(step: str, j: int, problem: Problem) -> bool:
  if len(step) > _MAX_STEP_CHARS:
    return False
  match = _STEP_RE.fullmatch(step)
  if match is None:
    return False
  a, op, b, c = match.groups()
  a, b, c = int(a), int(b), int(c)
  return (a == problem.values[j] and op == problem.ops[j]
          and b == problem.operands[j] and c == _apply(a, op, b))


def check_solution(problem: Problem, response_text: str,
                   delimiter: str = segmentation.DEFAULT_DELIMITER
                   ) -> StepLabels:
  """Labels every step of a response against the problem's ground truth.

  Steps come from `segmentation.split_steps(response_text, delimiter)`. For a
  problem with k operations:

  * step j < k is correct iff it reads `a op b=c` (digits only, zero padding
    optional), a is the TRUE running value before operation j, op and b are
    the question's j-th operator and operand, and c = a op b;
  * step k is correct iff it reads `#N` with N the true answer;
  * steps after k, empty or unparsable steps are incorrect.

  The checker never raises on any string and takes time linear in the text
  length (lines longer than a few dozen characters are rejected unread).

  Args:
    problem: the problem.
    response_text: the decoded response (without EOS).
    delimiter: the step delimiter.

  Returns:
    The step labels, first error, answer verdict and step count.
  """
  if not isinstance(response_text, str):
    raise ValueError(
        f"response_text must be a str, got {type(response_text).__name__}.")
  steps = segmentation.split_steps(response_text, delimiter)
  num_ops = problem.num_ops
  labels = [_step_correct(step, j, problem)
            for j, step in enumerate(steps[:num_ops])]
  if len(steps) > num_ops:
    labels.append(_answer_value(steps[num_ops]) == problem.answer)
    labels.extend([False] * (len(steps) - num_ops - 1))
  try:
    first_error = labels.index(False)
  except ValueError:
    first_error = -1
  answer_correct = _answer_value(steps[-1]) == problem.answer
  return StepLabels(labels=labels, first_error=first_error,
                    answer_correct=answer_correct, num_steps=len(labels))


def outcome_reward(problem: Problem, response_text: str, finished: bool,
                   delimiter: str = segmentation.DEFAULT_DELIMITER) -> float:
  """1.0 iff the response finished (ended with EOS) and its answer is right."""
  if not finished:
    return 0.0
  return float(check_solution(problem, response_text, delimiter).answer_correct)


CORRUPTION_KINDS = ("arithmetic", "operand", "operator", "skip", "answer")


class CorruptedSolution(NamedTuple):
  """A faulty solution and the index of its first wrong step."""
  text: str
  first_error: int
  kind: str


def _nonzero_delta(rng: np.random.Generator, low_bound: int) -> int:
  """A nonzero integer in [-9, 9] that keeps (value + delta) >= 0.

  Args:
    rng: the generator.
    low_bound: the value being perturbed; deltas below -low_bound are skipped.
  """
  choices = [d for d in range(-9, 10) if d != 0 and d >= -low_bound]
  return int(rng.choice(choices))


def corrupt_solution(problem: Problem, rng: np.random.Generator, kind: str,
                     delimiter: str = segmentation.DEFAULT_DELIMITER
                     ) -> CorruptedSolution:
  """A solution with one injected mistake, in the reference format.

  Kinds (j is drawn uniformly from the valid positions):
    arithmetic: step j's result is off by a nonzero amount; later steps
      compute correctly from the wrong value.
    operand: step j uses a different operand than the question's.
    operator: step j uses the other operator.
    skip: operation j is left out; later steps continue without it.
    answer: every step is right but the final answer is off.

  The first error is the first step that differs from the reference solution
  (j for all kinds except skip, where two equal consecutive operations move
  it later, and answer, where it is k).

  Args:
    problem: the problem.
    rng: a numpy Generator.
    kind: one of CORRUPTION_KINDS.
    delimiter: the step delimiter.

  Returns:
    The corrupted text, its first-error index and the kind.
  """
  if kind not in CORRUPTION_KINDS:
    raise ValueError(f"kind must be one of {CORRUPTION_KINDS}, got {kind!r}.")
  num_ops = problem.num_ops
  ops, operands = list(problem.ops), list(problem.operands)
  j = int(rng.integers(0, num_ops))
  lines = []
  value = problem.values[0]
  if kind == "skip":
    del ops[j], operands[j]
  for step, (op, b) in enumerate(zip(ops, operands)):
    if step == j and kind == "operand":
      low, high = 1, 10 ** problem.operand_width - 1
      candidates = [x for x in range(low, high + 1)
                    if x != b and (op == "+" or x <= value)]
      if not candidates:
        candidates = [x for x in range(low, high + 1) if x != b]
      b = int(rng.choice(candidates))
    if step == j and kind == "operator":
      op = "-" if op == "+" else "+"
    result = _apply(value, op, b)
    if step == j and kind == "arithmetic":
      result += _nonzero_delta(rng, result)
    lines.append(_step_line(value, op, b, result, problem))
    value = result
  if kind == "answer":
    value += _nonzero_delta(rng, value)
  lines.append(_answer_line(value, problem))
  reference = reference_lines(problem)
  first_error = next(
      (i for i, (got, want) in enumerate(zip(lines, reference)) if got != want),
      min(len(lines), len(reference)))
  return CorruptedSolution(segmentation.join_steps(lines, delimiter),
                           first_error, kind)
