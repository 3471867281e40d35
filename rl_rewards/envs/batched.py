"""Environments of multi-turn episodes, batched over rows, with limits.

One row's environment is any object with

    observation = env.reset(problem)                     # the first prompt
    observation, reward, done, info = env.step(action)   # after each turn

(`Env`): `problem` is whatever the task hands out, `action` the text of the
policy's turn, `observation` text that is appended to the episode (as
tokens, masked out of every loss and scorer), `reward` a float and `info` a
dict of anything picklable. `BatchedEnv` runs B of them, one per row, each
with its own state:

    envs = BatchedEnv(lambda: hidden_operands.HiddenOperandsEnv(task_cfg))
    first = envs.reset(problems)               # [B] observations
    out = envs.step(actions)                   # `BatchedStep` of B rows

and applies the limits of the verifiers (`rl_rewards.tasks.verifiers`),
since an action is model output and therefore adversarial:

* an action longer than `max_action_chars`, or that is not a str, ends its
  row with reward 0 without reaching the environment (counted as
  `oversize` / `wrong_type`);
* an observation longer than `max_observation_chars` is cut to that length
  (counted as `observations_cut`);
* a `step` that raises ends its row with reward 0 (`errors`);
* with `isolation="process"` every `step` runs in a worker of a
  `verifiers.VerifierPool` (the row's environment object travels with the
  call and comes back updated) under the pool's time limit `timeout_s` and
  memory cap: a hung step is killed with its worker, a crashed worker is
  replaced, and only that row ends (reward 0, `timeouts` / `crashes`).
  With `isolation="inline"` (the default) steps run in this process, for
  environments whose step is linear-time by construction, like the
  in-process verifier kinds; their time is measured, not limited.

A row that ended (done, or stopped by a limit) takes `None` as its next
action and returns an empty observation, reward 0, done True. An
environment that breaks its contract (an observation that is not a str, a
non-finite reward) raises `errors.InputError` naming the row: that is a bug
in the environment, not model output.
"""

import dataclasses
import math
import time
from typing import Any, Callable, List, NamedTuple, Optional, Protocol, Sequence

import numpy as np

from rl_rewards import errors
from rl_rewards.tasks import verifiers

ISOLATIONS = ("inline", "process")
DEFAULT_MAX_ACTION_CHARS = verifiers.DEFAULT_MAX_CHARS
DEFAULT_MAX_OBSERVATION_CHARS = 2_000


class Env(Protocol):
  """One row's environment (host-side, stateful, picklable for
  `isolation="process"`)."""

  def reset(self, problem: Any) -> str:
    ...

  def step(self, action: str) -> tuple[str, float, bool, dict]:
    ...


class BatchedStep(NamedTuple):
  """What `BatchedEnv.step` returns for B rows.

  Attributes:
    observations: B strs, the text to append to each row ("" for rows that
      ended before this step or are cut off by a limit).
    rewards: [B] float32 rewards of this step (0 where a limit stopped the
      row).
    dones: [B] bool, True for rows that are over after this step.
    infos: B dicts: the environment's info, plus "status": "ok", "ended"
      (the row was over before this step), "oversize", "wrong_type",
      "error", "timeout" or "crash".
  """
  observations: List[str]
  rewards: np.ndarray
  dones: np.ndarray
  infos: List[dict]


@dataclasses.dataclass
class EnvStats:
  """Counts of what happened to environment steps (as `VerifierStats`).

  Attributes:
    calls: steps of live rows (including those stopped by a limit).
    timeouts: steps stopped by the time limit (process isolation).
    errors: steps that raised.
    oversize: actions longer than `max_action_chars`.
    crashes: steps whose worker process died.
    wrong_type: actions that were neither str nor None.
    observations_cut: observations cut to `max_observation_chars`.
    max_call_s: the longest step, in seconds.
  """
  calls: int = 0
  timeouts: int = 0
  errors: int = 0
  oversize: int = 0
  crashes: int = 0
  wrong_type: int = 0
  observations_cut: int = 0
  max_call_s: float = dataclasses.field(default=0.0, compare=False)

  def as_dict(self, prefix: str = "") -> dict:
    return {prefix + k: v for k, v in dataclasses.asdict(self).items()}


# The `EnvStats` counter of each failed step's status.
_FAILURE_COUNTERS = {"error": "errors", "timeout": "timeouts",
                     "crash": "crashes"}


def _step_in_worker(action: str, env: Any):
  """A pool call: steps `env` and sends it back with the transition."""
  result = env.step(action)
  return env, result


# Tells the verifier pool to return the transition as is (not a score).
_step_in_worker.returns_any = True


class BatchedEnv:
  """B environments, one per row, stepped together with limits.

  Attributes:
    batch_size: B, rows since the last `reset` (0 before).
    done: [B] bool, rows that are over.
    stats: `EnvStats` since construction.
  """

  def __init__(self, make_env: Callable[[], Any], *,
               isolation: str = "inline",
               timeout_s: float = verifiers.DEFAULT_TIMEOUT_S,
               max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
               max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
               pool: Optional[verifiers.VerifierPool] = None,
               worker_modules: Sequence[str] = ()):
    """Builds the batch (rows are created by `reset`).

    Args:
      make_env: () -> a fresh `Env` (called once per row at each reset).
      isolation: "inline" (steps in this process) or "process" (steps in
        the pool's workers, under `timeout_s`).
      timeout_s: time limit per step with process isolation.
      max_action_chars: longer actions end their row with reward 0.
      max_observation_chars: longer observations are cut to this length.
      pool: the worker pool for process isolation (default: the verifiers'
        shared pool).
      worker_modules: modules the workers import before their first timed
        step (e.g. ("reasoning_gym",), which takes seconds to import).
    """
    if not callable(make_env):
      raise errors.InputError(f"make_env must be callable, got {make_env!r}.")
    if isolation not in ISOLATIONS:
      raise errors.InputError(
          f"isolation must be one of {ISOLATIONS}, got {isolation!r}.")
    for name, value in (("timeout_s", timeout_s),
                        ("max_action_chars", max_action_chars),
                        ("max_observation_chars", max_observation_chars)):
      if isinstance(value, bool) or not value > 0:
        raise errors.InputError(f"{name} must be > 0, got {value!r}.")
    self._make_env = make_env
    self.isolation = isolation
    self.timeout_s = float(timeout_s)
    self.max_action_chars = int(max_action_chars)
    self.max_observation_chars = int(max_observation_chars)
    self._pool = pool
    self.worker_modules = tuple(worker_modules)
    self._envs = []
    self.done = np.zeros((0,), bool)
    self.stats = EnvStats()

  @property
  def batch_size(self) -> int:
    return len(self._envs)

  def reset(self, problems: Sequence[Any]) -> List[str]:
    """Starts one episode per problem; returns the B first observations.

    Problems are trusted task data, so `reset` runs in this process without
    a time limit (only the observation length is limited).
    """
    problems = list(problems)
    if not problems:
      raise errors.InputError("reset needs at least one problem.")
    self._envs = [self._make_env() for _ in problems]
    self.done = np.zeros((len(problems),), bool)
    observations = []
    for row, (env, problem) in enumerate(zip(self._envs, problems)):
      observation = env.reset(problem)
      if not isinstance(observation, str):
        raise errors.InputError(
            f"{type(env).__name__}.reset returned a "
            f"{type(observation).__name__} for row {row}; observations must "
            "be str.")
      observations.append(self._cut(observation))
    return observations

  def _cut(self, observation: str) -> str:
    if len(observation) > self.max_observation_chars:
      self.stats.observations_cut += 1
      return observation[:self.max_observation_chars]
    return observation

  def _checked(self, row: int, result) -> tuple[str, float, bool, dict]:
    """The transition of row `row`, its types checked (InputError)."""
    env = type(self._envs[row]).__name__
    if not isinstance(result, tuple) or len(result) != 4:
      raise errors.InputError(
          f"{env}.step must return (observation, reward, done, info); row "
          f"{row} got {result!r:.200}.")
    observation, reward, done, info = result
    if not isinstance(observation, str):
      raise errors.InputError(
          f"{env}.step returned a {type(observation).__name__} observation "
          f"for row {row}; observations must be str.")
    if (isinstance(reward, bool) or
        not isinstance(reward, (int, float, np.integer, np.floating)) or
        not math.isfinite(float(reward))):
      raise errors.InputError(
          f"{env}.step returned reward {reward!r} for row {row}; rewards must "
          "be finite numbers.")
    if not isinstance(done, (bool, np.bool_)):
      raise errors.InputError(
          f"{env}.step returned done={done!r} for row {row}; done must be a "
          "bool.")
    if info is None:
      info = {}
    if not isinstance(info, dict):
      raise errors.InputError(
          f"{env}.step returned info of type {type(info).__name__} for row "
          f"{row}; info must be a dict.")
    return observation, float(reward), bool(done), dict(info)

  def step(self, actions: Sequence[Optional[str]]) -> BatchedStep:
    """Steps every live row with its action (None for rows that are over).

    Args:
      actions: B action texts; None for the rows in `done` (and only them).

    Returns:
      The `BatchedStep` of the B rows.

    Raises:
      InputError: on a wrong number of actions, an action for a row that is
        over, a missing action for a live row, or an environment that
        breaks its contract.
    """
    actions = list(actions)
    batch = self.batch_size
    if batch == 0:
      raise errors.InputError("step before reset: no rows.")
    if len(actions) != batch:
      raise errors.InputError(
          f"step got {len(actions)} actions for {batch} rows.")
    observations = [""] * batch
    rewards = np.zeros((batch,), np.float32)
    dones = np.ones((batch,), bool)
    infos = [{"status": "ended"} for _ in range(batch)]
    pending = []
    for row, action in enumerate(actions):
      if self.done[row]:
        if action is not None:
          raise errors.InputError(
              f"row {row} is over (done); pass None as its action, got "
              f"{action!r:.80}.")
        continue
      if action is None:
        raise errors.InputError(
            f"row {row} is live but its action is None; only rows that are "
            "over take None.")
      self.stats.calls += 1
      if not isinstance(action, str):
        self.stats.wrong_type += 1
        infos[row] = {"status": "wrong_type"}
      elif len(action) > self.max_action_chars:
        self.stats.oversize += 1
        infos[row] = {"status": "oversize"}
      else:
        pending.append((row, action))
    if self.isolation == "inline":
      outcomes = self._step_inline(pending)
    else:
      outcomes = self._step_in_pool(pending)
    for row, (status, seconds, result) in outcomes.items():
      self.stats.max_call_s = max(self.stats.max_call_s, seconds)
      if status != "ok":
        counter = _FAILURE_COUNTERS[status]
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        infos[row] = {"status": status}
        continue
      observation, reward, done, info = self._checked(row, result)
      observations[row] = self._cut(observation)
      rewards[row] = reward
      dones[row] = done
      infos[row] = {**info, "status": "ok"}
    self.done = self.done | dones
    return BatchedStep(observations, rewards, dones, infos)

  def _step_inline(self, pending):
    outcomes = {}
    for row, action in pending:
      start = time.perf_counter()
      try:
        result = self._envs[row].step(action)
        status = "ok"
      except Exception:  # pylint: disable=broad-except
        result, status = None, "error"
      outcomes[row] = (status, time.perf_counter() - start, result)
    return outcomes

  def _step_in_pool(self, pending):
    if not pending:
      return {}
    pool = self._pool or verifiers.default_pool()
    items = [(row, action, self._envs[row]) for row, action in pending]
    results = pool.run_detailed(_step_in_worker, items,
                                timeout_s=self.timeout_s,
                                modules=self.worker_modules)
    outcomes = {}
    for row, call in results.items():
      result = None
      if call.status == "ok":
        if (not isinstance(call.score, tuple) or len(call.score) != 2):
          raise errors.InputError(f"row {row}: the worker returned "
                                  f"{call.score!r:.200}.")
        self._envs[row], result = call.score
      outcomes[row] = (call.status, call.seconds, result)
    return outcomes

  def end_rows(self, rows) -> None:
    """Marks rows as over from outside (the policy ended its episode, or
    the context is full): they take None from the next step on.

    Args:
      rows: [B] bool, True on the rows to end.
    """
    rows = np.asarray(rows, bool)
    if rows.shape != self.done.shape:
      raise errors.InputError(f"end_rows needs a [B={self.batch_size}] bool "
                              f"mask, got shape {rows.shape}.")
    self.done = self.done | rows

  def close(self) -> None:
    """Drops the rows (a pool passed in is the caller's to close)."""
    self._envs = []
    self.done = np.zeros((0,), bool)
