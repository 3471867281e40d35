"""Outcome verifiers with time and size limits.

Model output is adversarial: a verifier must never hang, crash or exhaust the
memory of the training process. Every kind here has

* an input size limit: predictions (and references) longer than `max_chars`
  characters, or with brackets nested deeper than `max_depth`, score 0 and
  are counted as `oversize` without being parsed;
* a time limit: the in-process kinds ("exact", "gsm8k") are linear-time by
  construction; the kinds that call third-party parsers ("math" for
  math-verify, "reasoning_gym") run in a process pool, each call under a
  `timeout_s` alarm in the worker's main thread (math-verify relies on
  signals, which only work there) and a memory cap, and the caller gives up
  on calls that are still running after a deadline, restarting the pool.
  Such calls score 0 and are counted as `timeouts`.

Use `verify_batch(kind, predictions, references)`; it returns a float32 score
array of 0s and 1s and a `VerifierStats`.
"""

import atexit
import concurrent.futures
import dataclasses
import functools
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from rl_rewards.tasks import answers

KINDS = ("exact", "gsm8k", "math", "reasoning_gym")
DEFAULT_MAX_CHARS = 10_000
DEFAULT_MAX_DEPTH = 100
DEFAULT_TIMEOUT_S = 5.0
# Address-space cap of a pool worker (math-verify + sympy use ~0.5 GiB).
DEFAULT_WORKER_MEMORY_BYTES = 4 << 30


@dataclasses.dataclass
class VerifierStats:
  """Counts of what happened to verifier calls.

  Attributes:
    calls: predictions scored (including those that hit a limit).
    timeouts: calls stopped by the time limit (scored 0).
    errors: calls whose parser or scorer raised (scored 0).
    oversize: inputs rejected by the size or nesting limit (scored 0).
  """
  calls: int = 0
  timeouts: int = 0
  errors: int = 0
  oversize: int = 0

  def __add__(self, other: "VerifierStats") -> "VerifierStats":
    return VerifierStats(*(a + b for a, b in zip(
        dataclasses.astuple(self), dataclasses.astuple(other))))

  def as_dict(self, prefix: str = "") -> dict[str, int]:
    return {prefix + k: v for k, v in dataclasses.asdict(self).items()}


def _too_big(text: str, max_chars: int, max_depth: int) -> bool:
  return len(text) > max_chars or answers.max_brace_depth(text) > max_depth


def exact_match(prediction: str, reference: str) -> float:
  """1.0 iff the texts are equal after stripping surrounding whitespace."""
  return float(prediction.strip() == reference.strip())


def gsm8k_match(prediction: str, reference: str) -> float:
  """1.0 iff the numeric answers are equal.

  The reference is either a GSM8K solution ending in "#### x" or the bare
  answer; the prediction's number is found by
  `answers.gsm8k_prediction_number` ("#### x", else the last \\boxed{}, else
  the last number). Commas and "$" are ignored and values compared exactly,
  so "1,000" == "1000" and "2.50" == "2.5".

  Args:
    prediction: the model response.
    reference: the reference solution or answer.

  Returns:
    1.0 or 0.0.
  """
  final = answers.gsm8k_final_answer(reference)
  target = answers.parse_number(final if final is not None else reference)
  if target is None:
    raise ValueError(f"reference has no number: {reference[:80]!r}")
  value = answers.gsm8k_prediction_number(prediction)
  return float(value is not None and value == target)


_IN_PROCESS_SCORERS = {"exact": exact_match, "gsm8k": gsm8k_match}


# ---------------------------------------------------------------------------
# Pool workers. These run in a separate process (forkserver or spawn).

class _CallTimeout(BaseException):
  """Raised by the worker's alarm; a BaseException so that third-party
  `except Exception` handlers do not swallow it."""


def _on_alarm(signum, frame):
  del signum, frame
  raise _CallTimeout()


def _init_worker(memory_bytes: Optional[int]) -> None:
  if memory_bytes:
    try:
      import resource  # pylint: disable=g-import-not-at-top
      _, hard = resource.getrlimit(resource.RLIMIT_AS)
      limit = memory_bytes if hard == resource.RLIM_INFINITY else min(
          memory_bytes, hard)
      resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
      pass
  signal.signal(signal.SIGALRM, _on_alarm)


def _math_verify_score(prediction: str, reference: str) -> float:
  import math_verify  # pylint: disable=g-import-not-at-top
  gold = math_verify.parse(reference, parsing_timeout=None)
  pred = math_verify.parse(prediction, parsing_timeout=None)
  return float(bool(math_verify.verify(gold, pred, timeout_seconds=None)))


_RG_DATASETS = {}


def _reasoning_gym_score(prediction: str, entry: dict,
                         threshold: float = 1.0) -> float:
  import reasoning_gym  # pylint: disable=g-import-not-at-top
  name = entry["metadata"]["source_dataset"]
  if name not in _RG_DATASETS:
    _RG_DATASETS[name] = reasoning_gym.create_dataset(name, size=1, seed=0)
  score = _RG_DATASETS[name].score_answer(prediction, entry)
  return float(score is not None and score >= threshold)


# The library each pooled kind imports once per worker, outside any alarm.
_POOLED_MODULES = {"math": ("math_verify",),
                   "reasoning_gym": ("reasoning_gym",)}


def _import_modules(modules: Sequence[str]) -> bool:
  import importlib  # pylint: disable=g-import-not-at-top
  import logging  # pylint: disable=g-import-not-at-top
  for name in modules:
    importlib.import_module(name)
  # math-verify warns on every call that we run its timeouts ourselves.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  return True


def _pooled_call(score_fn, prediction: str, reference: Any,
                 timeout_s: float, modules: Sequence[str]
                 ) -> tuple[float, str]:
  """Runs `score_fn` under an alarm in a worker; returns (score, status)."""
  _import_modules(modules)  # Never time (or interrupt) a library import.
  try:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
      return float(score_fn(prediction, reference)), "ok"
    finally:
      # Inside the outer try: an alarm that fires just before it is
      # cleared still lands in the handler below.
      signal.setitimer(signal.ITIMER_REAL, 0)
  except _CallTimeout:
    return 0.0, "timeout"
  except Exception:  # pylint: disable=broad-except
    return 0.0, "error"


# ---------------------------------------------------------------------------
# Caller side.

class VerifierPool:
  """A process pool for the third-party verifiers.

  Workers start lazily with the forkserver method (spawn where unavailable),
  import the verifier library once, and run each call under an alarm. A
  call that ignores the alarm (e.g. stuck in C code) is abandoned at the
  deadline; the pool is then killed and restarted on the next use.

  Attributes:
    num_workers: worker processes.
    memory_bytes: address-space cap per worker (None for no cap).
  """

  def __init__(self, num_workers: Optional[int] = None,
               memory_bytes: Optional[int] = DEFAULT_WORKER_MEMORY_BYTES,
               start_method: Optional[str] = None):
    self.num_workers = num_workers or max(1, min(2, os.cpu_count() or 1))
    self.memory_bytes = memory_bytes
    methods = multiprocessing.get_all_start_methods()
    self._start_method = start_method or (
        "forkserver" if "forkserver" in methods else "spawn")
    self._executor = None
    self._warm_modules = set()
    self._lock = threading.Lock()
    self.restarts = 0

  def _ensure_started(self, modules: Sequence[str],
                      startup_timeout_s: float) -> None:
    if self._executor is None:
      self._executor = concurrent.futures.ProcessPoolExecutor(
          max_workers=self.num_workers,
          mp_context=multiprocessing.get_context(self._start_method),
          initializer=_init_worker, initargs=(self.memory_bytes,))
      self._warm_modules = set()
    if not set(modules) <= self._warm_modules:
      # Import the library in the workers before timing any call.
      futures = [self._executor.submit(_import_modules, tuple(modules))
                 for _ in range(self.num_workers)]
      concurrent.futures.wait(futures, timeout=startup_timeout_s)
      self._warm_modules.update(modules)

  def kill(self) -> None:
    """Stops all workers now, including ones stuck in a call."""
    executor, self._executor = self._executor, None
    if executor is None:
      return
    # ProcessPoolExecutor has no public way to stop a busy worker.
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
      if process.is_alive():
        process.kill()
    for process in processes:
      process.join(timeout=5)

  def run(self, score_fn, items: Sequence[tuple[int, str, Any]], *,
          timeout_s: float, modules: Sequence[str] = (),
          startup_timeout_s: float = 120.0
          ) -> tuple[dict[int, float], int, int]:
    """Scores `items` in the workers.

    Args:
      score_fn: a picklable (module-level) function (prediction, reference)
        -> float.
      items: (position, prediction, reference) triples.
      timeout_s: time limit per call.
      modules: modules the workers import before the first timed call.
      startup_timeout_s: time allowed for starting workers and imports.

    Returns:
      (scores by position, number of timeouts, number of errors).
    """
    with self._lock:
      if not items:
        return {}, 0, 0
      # Workers import score_fn's module to unpickle it: warm that up too.
      fn_module = getattr(getattr(score_fn, "func", score_fn), "__module__",
                          None)
      modules = tuple(modules) + ((fn_module,) if fn_module else ())
      self._ensure_started(modules, startup_timeout_s)
      futures = {
          self._executor.submit(_pooled_call, score_fn, prediction,
                                reference, timeout_s, tuple(modules)): position
          for position, prediction, reference in items}
      # Every call has its own alarm; the deadline is a backstop for calls
      # that cannot be interrupted, with room for queueing behind others.
      waves = -(-len(items) // self.num_workers)
      deadline = (time.monotonic() + (waves + 1) * timeout_s +
                  min(5.0, 1.0 + timeout_s))
      done, not_done = concurrent.futures.wait(
          futures, timeout=max(0.0, deadline - time.monotonic()))
      scores, timeouts, errors, broken = {}, 0, 0, False
      for future in done:
        try:
          score, status = future.result()
        except (Exception, _CallTimeout):  # pylint: disable=broad-except
          # A worker died (e.g. out of memory) and broke the pool.
          score, status, broken = 0.0, "error", True
        scores[futures[future]] = score
        timeouts += status == "timeout"
        errors += status == "error"
      for future in not_done:
        scores[futures[future]] = 0.0
      timeouts += len(not_done)
      if not_done or broken:
        self.kill()
        self.restarts += 1
      return scores, timeouts, errors

  def close(self) -> None:
    self.kill()


_DEFAULT_POOL: Optional[VerifierPool] = None


def default_pool() -> VerifierPool:
  """The process-wide pool used when `verify_batch` gets none."""
  global _DEFAULT_POOL
  if _DEFAULT_POOL is None:
    _DEFAULT_POOL = VerifierPool()
  return _DEFAULT_POOL


@atexit.register
def _close_default_pool() -> None:
  if _DEFAULT_POOL is not None:
    _DEFAULT_POOL.close()


def _reference_text(kind: str, reference: Any) -> str:
  if kind == "reasoning_gym":
    if not isinstance(reference, dict) or "answer" not in reference:
      raise ValueError(
          "reasoning_gym references must be reasoning-gym entries (dicts "
          f"with 'answer' and 'metadata'), got {type(reference).__name__}.")
    return str(reference["answer"])
  if not isinstance(reference, str):
    raise ValueError(
        f"{kind} references must be str, got {type(reference).__name__}.")
  return reference


def verify_batch(kind: str, predictions: Sequence[Optional[str]],
                 references: Sequence[Any], *,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_chars: int = DEFAULT_MAX_CHARS,
                 max_depth: int = DEFAULT_MAX_DEPTH,
                 threshold: float = 1.0,
                 pool: Optional[VerifierPool] = None
                 ) -> tuple[np.ndarray, VerifierStats]:
  """Scores predictions against references with one verifier kind.

  Args:
    kind: "exact", "gsm8k", "math" (math-verify) or "reasoning_gym".
    predictions: N model answers; None (e.g. no answer extracted) scores 0.
    references: N references: strings, or reasoning-gym entries for
      "reasoning_gym" (the dataset is rebuilt from
      `entry["metadata"]["source_dataset"]` with its default config).
    timeout_s: time limit per call for the pooled kinds.
    max_chars: predictions longer than this score 0 (counted as oversize).
    max_depth: predictions with deeper bracket nesting score 0 (oversize).
    threshold: reasoning-gym scores >= threshold count as 1 (its partial
      credit, e.g. 0.125 for a wrong sum, counts as 0).
    pool: the process pool for pooled kinds; defaults to a shared one.

  Returns:
    (scores float32 [N] of 0.0/1.0, stats).
  """
  if kind not in KINDS:
    raise ValueError(f"verifier kind must be one of {KINDS}, got {kind!r}.")
  if len(predictions) != len(references):
    raise ValueError(f"got {len(predictions)} predictions but "
                     f"{len(references)} references.")
  stats = VerifierStats(calls=len(predictions))
  scores = np.zeros((len(predictions),), np.float32)
  pending = []
  for i, (prediction, reference) in enumerate(zip(predictions, references)):
    reference_text = _reference_text(kind, reference)
    if prediction is None:
      continue
    if not isinstance(prediction, str):
      raise ValueError(f"prediction {i} must be a str or None, got "
                       f"{type(prediction).__name__}.")
    if (_too_big(prediction, max_chars, max_depth) or
        _too_big(reference_text, max_chars, max_depth)):
      stats.oversize += 1
      continue
    if kind in _IN_PROCESS_SCORERS:
      try:
        scores[i] = _IN_PROCESS_SCORERS[kind](prediction, reference_text)
      except Exception:  # pylint: disable=broad-except
        stats.errors += 1
    else:
      pending.append((i, prediction, reference))
  if pending:
    pool = pool or default_pool()
    if kind == "math":
      score_fn = _math_verify_score
    else:
      score_fn = functools.partial(_reasoning_gym_score, threshold=threshold)
    results, timeouts, errors = pool.run(
        score_fn, pending, timeout_s=timeout_s, modules=_POOLED_MODULES[kind])
    for position, score in results.items():
      scores[position] = score
    stats.timeouts += timeouts
    stats.errors += errors
  return scores, stats
