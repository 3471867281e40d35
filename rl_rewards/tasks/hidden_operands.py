"""Hidden operands: the embedded multi-turn task with ground truth per turn.

The question names a chain of variables, "x0+x1-x2=", whose values are
stored behind a lookup tool. Each turn is one line: the policy fetches a
value, computes the next partial result, or answers.

    prompt (observation 0)    x0+x1-x2=
    turn 0                    get x0\\n        -> observation  x0=23\\n
    turn 1                    get x1\\n        -> observation  x1=07\\n
    turn 2                    023+07=030\\n    -> (no observation)
    turn 3                    get x2\\n        -> observation  x2=15\\n
    turn 4                    030-15=015\\n
    turn 5                    #015\\n          -> reward 1, done

The chains are those of `tasks.arith` (same generator, splits, fixed-width
format and step grammar, with the question's numbers replaced by
variables), optionally with `num_distractors` extra stored variables that
the question does not use.

Why this shape. The papers that assign credit per turn (IGPO, arXiv
2510.14967; SPA-RL, arXiv 2505.20732; ArCHer, arXiv 2402.19446; G-RA, arXiv
2508.10548) gain over outcome rewards where (i) episodes are long — 5 to 30
turns; here a chain of k operations takes 2k + 2 turns, 6 to 14 for the
default k in [2, 6]; (ii) the final reward is sparse — here one number,
at the end, and early policies finish few episodes right, so most groups are
all-wrong; (iii) observations carry information that later turns need —
here the values exist nowhere but in the tool's answers, so no turn can
compute before the fetches it depends on, and (iv) some turns progress while
others waste the budget — fetching a value twice, fetching a distractor, a
wrong or premature computation, or an unparsable line. An outcome reward
spreads one number over all of these turns; a turn-level signal can tell
them apart, and because this task's checker knows which turns progressed,
it measures how well each method's signal does so, with the oracle labels as
the upper bound (as `arith.check_solution` does for reasoning steps).

Per-turn ground truth (`label_turns`): turn i made progress iff it

* fetched a value the question needs (x0..xk) that was not fetched before;
* computed the next partial result: "a op b=c" with a the true running
  value before operation j (the first value x0 for j = 0), op and b the
  question's j-th operator and operand value, c = a op b, where j is the
  number of partial results already computed and the values it uses were
  fetched (so that the result is not a guess);
* gave the right final answer "#N".

The environment (`HiddenOperandsEnv`) applies the same transition: it
answers "get xi" with "xi=V" (also for distractors and repeated fetches,
"?" for a variable that does not exist), gives no observation after a
computation (it does not tell the policy whether it was right), ends the
episode on an answer line with reward 1 if it is right, and answers any
other line with "?". Its info carries the turn's progress label, which
equals `label_turns` on the episode's actions.
"""

import dataclasses
import re
import zlib
from typing import NamedTuple, Optional, Sequence

import numpy as np

from rl_rewards import errors
from rl_rewards.tasks import arith
from rl_rewards.tasks import tokenizer as tokenizer_lib

# The arithmetic alphabet plus what "get x3" and "?" need.
ALPHABET = tokenizer_lib.ARITH_ALPHABET + "getx ?"
END_OF_TURN = "\n"
UNKNOWN = "?" + END_OF_TURN
# Lines longer than this are rejected unread (they cannot be valid).
_MAX_LINE_CHARS = 40
_GET_RE = re.compile(r"get x([0-9]{1,4})")
_STEP_RE = re.compile(r"([0-9]{1,9})([+-])([0-9]{1,9})=([0-9]{1,9})")
_ANSWER_RE = re.compile(r"#([0-9]{1,9})")


@dataclasses.dataclass(frozen=True)
class HiddenOperandsConfig:
  """Distribution of hidden-operand problems.

  Attributes:
    chains: the chains (`arith.ArithConfig`: length, numbers, format,
      seed).
    num_distractors: stored variables beyond the question's (fetching one
      is a wasted turn).
  """
  chains: arith.ArithConfig = dataclasses.field(
      default_factory=arith.ArithConfig)
  num_distractors: int = 0

  def __post_init__(self):
    if (isinstance(self.num_distractors, bool) or
        not isinstance(self.num_distractors, int) or self.num_distractors < 0):
      raise errors.InputError(
          "HiddenOperandsConfig.num_distractors must be an int >= 0, got "
          f"{self.num_distractors!r}.")


@dataclasses.dataclass(frozen=True)
class HiddenProblem:
  """One chain with its values stored behind the lookup tool.

  Attributes:
    chain: the arithmetic problem (values, operators, answer, format).
    stored: the values of x0, x1, ...: the chain's first number and
      operands, then the distractors.
    question: the prompt, e.g. "x0+x1-x2=".
  """
  chain: arith.Problem
  stored: tuple[int, ...]
  question: str

  @property
  def num_needed(self) -> int:
    """Variables the question uses (x0..xk): k + 1."""
    return self.chain.num_ops + 1

  @property
  def answer(self) -> int:
    return self.chain.answer


def problem_from_chain(chain: arith.Problem,
                       distractors: Sequence[int] = ()) -> HiddenProblem:
  """The hidden-operand version of an arithmetic chain."""
  stored = (chain.values[0], *chain.operands, *(int(d) for d in distractors))
  question = "x0" + "".join(f"{op}x{j + 1}" for j, op in enumerate(chain.ops))
  return HiddenProblem(chain=chain, stored=stored, question=question + "=")


def make_problem(cfg: HiddenOperandsConfig, index: int,
                 split: str = arith.TRAIN_SPLIT) -> HiddenProblem:
  """Problem `index` of `split`: `arith.make_problem`'s chain (so the
  train/held-out split is arith's) and seeded distractor values."""
  chain = arith.make_problem(cfg.chains, index, split)
  rng = np.random.default_rng(
      [cfg.chains.seed, zlib.crc32(split.encode("utf-8")), index,
       zlib.crc32(b"distractors")])
  a = cfg.chains
  distractors = rng.integers(a.large_operand_min, a.large_operand_max + 1,
                             size=cfg.num_distractors).tolist()
  return problem_from_chain(chain, distractors)


def make_problems(cfg: HiddenOperandsConfig, split: str,
                  indices) -> list[HiddenProblem]:
  return [make_problem(cfg, int(i), split) for i in indices]


def make_tokenizer() -> tokenizer_lib.CharTokenizer:
  """The character tokenizer of the task (prompts are the bare question)."""
  return tokenizer_lib.CharTokenizer(ALPHABET)


def _pad(value: int, width: int, fixed: bool) -> str:
  return str(value).zfill(width) if fixed else str(value)


def value_line(problem: HiddenProblem, i: int) -> str:
  """The tool's answer to "get xi", e.g. "x3=07\\n"."""
  chain = problem.chain
  return (f"x{i}=" + _pad(problem.stored[i], chain.operand_width,
                          chain.fixed_width) + END_OF_TURN)


def reference_actions(problem: HiddenProblem) -> list[str]:
  """An optimal episode's turns: fetch x0, then per operation j fetch
  x(j+1) and compute, then answer (2k + 2 lines, each with END_OF_TURN)."""
  chain = problem.chain
  fixed, value_w, operand_w = (chain.fixed_width, chain.value_width,
                               chain.operand_width)
  lines = ["get x0"]
  for j, (op, b) in enumerate(zip(chain.ops, chain.operands)):
    lines.append(f"get x{j + 1}")
    lines.append(_pad(chain.values[j], value_w, fixed) + op +
                 _pad(b, operand_w, fixed) + "=" +
                 _pad(chain.values[j + 1], value_w, fixed))
  lines.append("#" + _pad(chain.answer, value_w, fixed))
  return [line + END_OF_TURN for line in lines]


@dataclasses.dataclass
class EpisodeState:
  """What the checker tracks along an episode.

  Attributes:
    fetched: indices of the variables fetched so far.
    computed: partial results computed correctly so far (j).
    finished: an answer was given.
  """
  fetched: set = dataclasses.field(default_factory=set)
  computed: int = 0
  finished: bool = False


class Transition(NamedTuple):
  """One turn's effect: observation, reward, done, progress, kind."""
  observation: str
  reward: float
  done: bool
  progress: bool
  kind: str


def transition(problem: HiddenProblem, state: EpisodeState,
               action: str) -> Transition:
  """Applies one turn to `state` (in place) and labels it.

  Args:
    problem: the problem.
    state: the episode so far; updated.
    action: the turn's text (surrounding whitespace, e.g. the end-of-turn
      newline, is ignored).

  Returns:
    The `Transition`: kind is "get", "compute", "answer" or "invalid".
    Never raises on any str; linear time in its length.
  """
  if not isinstance(action, str):
    raise errors.InputError(
        f"actions must be str, got {type(action).__name__}.")
  if state.finished:
    raise errors.InputError("the episode is over (an answer was given).")
  line = action.strip() if len(action) <= 4 * _MAX_LINE_CHARS else ""
  if len(line) > _MAX_LINE_CHARS:
    line = ""
  chain = problem.chain
  match = _GET_RE.fullmatch(line)
  if match:
    i = int(match.group(1))
    if i >= len(problem.stored):
      return Transition(UNKNOWN, 0.0, False, False, "get")
    progress = i < problem.num_needed and i not in state.fetched
    state.fetched.add(i)
    return Transition(value_line(problem, i), 0.0, False, progress, "get")
  match = _STEP_RE.fullmatch(line)
  if match:
    a, op, b, c = match.groups()
    a, b, c = int(a), int(b), int(c)
    j = state.computed
    progress = (
        j < chain.num_ops and a == chain.values[j] and op == chain.ops[j] and
        b == chain.operands[j] and c == (a + b if op == "+" else a - b) and
        j + 1 in state.fetched and (j > 0 or 0 in state.fetched))
    state.computed += progress
    return Transition("", 0.0, False, progress, "compute")
  match = _ANSWER_RE.fullmatch(line)
  if match:
    correct = int(match.group(1)) == chain.answer
    state.finished = True
    return Transition("", float(correct), True, correct, "answer")
  return Transition(UNKNOWN, 0.0, False, False, "invalid")


class TurnLabels(NamedTuple):
  """Per-turn verdicts of an episode (`label_turns`).

  Attributes:
    labels: one bool per turn: did it make progress.
    answer_correct: the episode ended with the right answer.
    finished: the episode ended with an answer line.
    first_error: index of the first turn without progress, -1 if none.
  """
  labels: list
  answer_correct: bool
  finished: bool
  first_error: int


def label_turns(problem: HiddenProblem,
                actions: Sequence[str]) -> TurnLabels:
  """Labels every turn of an episode (the oracle's per-turn ground truth).

  Turns after an answer line are labelled False (the episode was over).

  Args:
    problem: the problem.
    actions: the text of each policy turn, in order.

  Returns:
    The `TurnLabels`.
  """
  state = EpisodeState()
  labels, correct = [], False
  for action in actions:
    if state.finished:
      labels.append(False)
      continue
    step = transition(problem, state, action)
    labels.append(step.progress)
    if step.kind == "answer":
      correct = step.reward > 0
  first_error = labels.index(False) if False in labels else -1
  return TurnLabels(labels, correct, state.finished, first_error)


def oracle_turn_labels(problems: Sequence[HiddenProblem],
                       actions: Sequence[Sequence[str]],
                       max_turns: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-turn labels of a batch of episodes, [B, max_turns].

  Args:
    problems: B problems.
    actions: B lists of turn texts (e.g. `EpisodeOutput.actions`).
    max_turns: the turn axis.

  Returns:
    (labels float32 [B, max_turns] of 0/1, turn_mask bool [B, max_turns]).
  """
  if len(problems) != len(actions):
    raise errors.InputError(
        f"got {len(problems)} problems but {len(actions)} action lists.")
  labels = np.zeros((len(problems), max_turns), np.float32)
  mask = np.zeros((len(problems), max_turns), bool)
  for row, (problem, turns) in enumerate(zip(problems, actions)):
    if len(turns) > max_turns:
      raise errors.InputError(
          f"row {row} has {len(turns)} turns, more than max_turns="
          f"{max_turns}.")
    labels[row, :len(turns)] = label_turns(problem, turns).labels
    mask[row, :len(turns)] = True
  return labels, mask


class HiddenOperandsEnv:
  """The lookup-tool environment of one row (see the module docstring).

  `reset(problem)` returns the question; `step(action)` returns
  (observation, reward, done, info) with info {"progress", "kind"}.
  """

  def __init__(self):
    self.problem: Optional[HiddenProblem] = None
    self.state = EpisodeState()

  def reset(self, problem: HiddenProblem) -> str:
    if not isinstance(problem, HiddenProblem):
      raise errors.InputError(
          "HiddenOperandsEnv.reset needs a HiddenProblem, got "
          f"{type(problem).__name__}.")
    self.problem = problem
    self.state = EpisodeState()
    return problem.question

  def step(self, action: str):
    if self.problem is None:
      raise errors.InputError("HiddenOperandsEnv.step before reset.")
    out = transition(self.problem, self.state, action)
    return (out.observation, out.reward, out.done,
            {"progress": out.progress, "kind": out.kind})
