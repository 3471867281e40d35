"""Any reasoning-gym dataset as a multi-turn text environment.

The question is the first observation; each turn is an answer attempt,
scored by the dataset's own `score_answer` (thresholded to 0/1, as
`tasks.reasoning_gym_tasks` does). A right answer ends the episode with
reward 1; a wrong one gets `retry_message` as the observation until
`max_attempts` attempts are spent (reward 0). With `max_attempts=1` this is
the single-turn task.

No checker labels these turns: the environment only knows the outcome, which
is what makes it the counterpart of the embedded tasks with per-turn ground
truth (`tasks.hidden_operands`), and a check that `BatchedEnv` and the
episode rollout need nothing task-specific. reasoning-gym's scorers are
third-party code, so run it with `BatchedEnv(..., isolation="process",
worker_modules=("reasoning_gym",))` when the answers are model output.
"""

from typing import Any, Optional

from rl_rewards import errors
from rl_rewards.tasks import reasoning_gym_tasks

DEFAULT_RETRY_MESSAGE = "Wrong answer, try again.\n"
# Scoring datasets, one per reasoning-gym name, built once per process.
_DATASETS = {}


def _scoring_dataset(entry: dict):
  name = entry["metadata"]["source_dataset"]
  if name not in _DATASETS:
    _DATASETS[name] = reasoning_gym_tasks.create_dataset(name, size=1, seed=0)
  return _DATASETS[name]


class AnswerAttemptsEnv:
  """A reasoning-gym question with up to `max_attempts` answers.

  Attributes:
    max_attempts: turns before the episode ends unsolved.
    threshold: `score_answer` >= threshold counts as right.
    retry_message: the observation after a wrong answer.
    attempts: answers given so far.
  """

  def __init__(self, max_attempts: int = 2, threshold: float = 1.0,
               retry_message: str = DEFAULT_RETRY_MESSAGE):
    if isinstance(max_attempts, bool) or not (
        isinstance(max_attempts, int) and max_attempts >= 1):
      raise errors.InputError(
          f"max_attempts must be an int >= 1, got {max_attempts!r}.")
    self.max_attempts = max_attempts
    self.threshold = float(threshold)
    self.retry_message = retry_message
    self.attempts = 0
    self._entry: Optional[dict] = None

  def reset(self, problem: Any) -> str:
    """Starts on a `TaskRecord` or a reasoning-gym entry dict."""
    entry = getattr(problem, "entry", problem)
    if not isinstance(entry, dict) or "question" not in entry or (
        "source_dataset" not in (entry.get("metadata") or {})):
      raise errors.InputError(
          "AnswerAttemptsEnv.reset needs a reasoning_gym_tasks.TaskRecord or "
          "a reasoning-gym entry (question, answer, metadata.source_dataset), "
          f"got {type(problem).__name__}.")
    self._entry = entry
    self.attempts = 0
    return str(entry["question"])

  def step(self, action: str):
    if self._entry is None:
      raise errors.InputError("AnswerAttemptsEnv.step before reset.")
    self.attempts += 1
    score = _scoring_dataset(self._entry).score_answer(action.strip(),
                                                       self._entry)
    correct = score is not None and score >= self.threshold
    info = {"attempt": self.attempts, "correct": bool(correct)}
    if correct:
      return "", 1.0, True, info
    if self.attempts >= self.max_attempts:
      return "", 0.0, True, info
    return self.retry_message, 0.0, False, info
