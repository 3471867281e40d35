"""Outcome verifiers with time and size limits.

Model output is adversarial: a verifier must never hang, crash or exhaust the
memory of the training process. Every kind here has

* an input size limit: predictions (and references) longer than `max_chars`
  characters, or with brackets nested deeper than `max_depth`, score 0 and
  are counted as `oversize` without being parsed;
* a type check: a prediction that is neither a str nor None scores 0 and is
  counted as `wrong_type` (a reference of the wrong type is a data error and
  raises);
* a time limit: the in-process kinds ("exact", "gsm8k") are linear-time by
  construction; the kinds that call third-party parsers ("math" for
  math-verify, "reasoning_gym") run in worker processes, each call under a
  `timeout_s` alarm in the worker's main thread (math-verify relies on
  signals, which only work there) and a memory cap. A call that ignores the
  alarm (stuck in C code) is killed with its worker `KILL_GRACE_S` later, and
  a worker that dies mid-call (a crash, the memory cap) is replaced; only
  that call scores 0, counted as `timeouts` or `crashes`, and the other calls
  of the batch go on in the other workers.

Use `verify_batch(kind, predictions, references)`; it returns a float32 score
array of 0s and 1s and a `VerifierStats`.
"""

import atexit
import collections
import dataclasses
import functools
import json
from multiprocessing import connection as mp_connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple, Optional, Sequence
import weakref

import numpy as np

from rl_rewards.tasks import answers

KINDS = ("exact", "gsm8k", "math", "reasoning_gym")
DEFAULT_MAX_CHARS = 10_000
DEFAULT_MAX_DEPTH = 100
DEFAULT_TIMEOUT_S = 5.0
# Address-space cap of a pool worker (math-verify + sympy use ~0.5 GiB).
DEFAULT_WORKER_MEMORY_BYTES = 4 << 30


# A call still running this long after its alarm is killed with its worker.
KILL_GRACE_S = 1.0
# After the first alarm of a call, it fires again at this interval.
_ALARM_REPEAT_S = 0.05


@dataclasses.dataclass
class VerifierStats:
  """Counts of what happened to verifier calls.

  Attributes:
    calls: predictions scored (including those that hit a limit).
    timeouts: calls stopped by the time limit (scored 0).
    errors: calls whose parser or scorer raised (scored 0).
    oversize: inputs rejected by the size or nesting limit (scored 0).
    crashes: calls whose worker process died (scored 0; worker replaced).
    wrong_type: predictions that were neither str nor None (scored 0).
    max_call_s: the longest call, in seconds (the maximum when added; not
      compared by ==, which compares the counts).
  """
  calls: int = 0
  timeouts: int = 0
  errors: int = 0
  oversize: int = 0
  crashes: int = 0
  wrong_type: int = 0
  max_call_s: float = dataclasses.field(default=0.0, compare=False)

  def __add__(self, other: "VerifierStats") -> "VerifierStats":
    counts = {f.name: getattr(self, f.name) + getattr(other, f.name)
              for f in dataclasses.fields(self) if f.name != "max_call_s"}
    return VerifierStats(**counts,
                         max_call_s=max(self.max_call_s, other.max_call_s))

  def as_dict(self, prefix: str = "") -> dict[str, float]:
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
# Worker processes. These run in a separate process (forkserver or spawn).

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
  # Ctrl-C goes to the caller, which stops the workers; a worker whose
  # caller has gone sees its pipe close and exits.
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def _math_verify_score(prediction: str, reference: str) -> float:
  import math_verify  # pylint: disable=g-import-not-at-top
  gold = math_verify.parse(reference, parsing_timeout=None)
  pred = math_verify.parse(prediction, parsing_timeout=None)
  return float(bool(math_verify.verify(gold, pred, timeout_seconds=None)))


_RG_DATASETS = {}


def _reasoning_gym_dataset(entry: dict):
  """The scoring dataset of a reasoning-gym entry (built once per worker)."""
  import reasoning_gym  # pylint: disable=g-import-not-at-top
  name = entry["metadata"]["source_dataset"]
  if name not in _RG_DATASETS:
    _RG_DATASETS[name] = reasoning_gym.create_dataset(name, size=1, seed=0)
  return _RG_DATASETS[name]


def _reasoning_gym_score(prediction: str, entry: dict,
                         threshold: float = 1.0) -> float:
  score = _reasoning_gym_dataset(entry).score_answer(prediction, entry)
  return float(score is not None and score >= threshold)


# The library each pooled kind imports once per worker, outside any alarm.
_POOLED_MODULES = {"math": ("math_verify",),
                   "reasoning_gym": ("reasoning_gym",)}
# Work on the (trusted) reference that runs before the alarm is set.
_PREPARE = {_reasoning_gym_score: _reasoning_gym_dataset}


def _import_modules(modules: Sequence[str]) -> bool:
  import importlib  # pylint: disable=g-import-not-at-top
  import logging  # pylint: disable=g-import-not-at-top
  for name in modules:
    importlib.import_module(name)
  # math-verify warns on every call that we run its timeouts ourselves.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  return True


def returns_any(score_fn) -> bool:
  """Whether a pooled function's result comes back as is (e.g. an
  environment transition, see `rl_rewards.envs`) rather than as a score
  checked to lie in [0, 1]: functions marked `fn.returns_any = True`."""
  return bool(getattr(getattr(score_fn, "func", score_fn), "returns_any",
                      False))


def _pooled_call(score_fn, prediction: str, reference: Any,
                 timeout_s: float) -> tuple[float, str]:
  """Runs `score_fn` under an alarm in a worker; returns (score, status)."""
  # A previous call may have blocked the alarm signal.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
  try:
    prepare = _PREPARE.get(getattr(score_fn, "func", score_fn))
    if prepare is not None:
      prepare(reference)  # Never timed: e.g. building a dataset.
    # The alarm repeats until cleared: an exception raised where Python
    # only prints it (a garbage-collection callback, a __del__) is lost,
    # and the next one lands.
    signal.setitimer(signal.ITIMER_REAL, timeout_s, _ALARM_REPEAT_S)
    try:
      score = score_fn(prediction, reference)
      if not returns_any(score_fn):
        score = float(score)
    finally:
      # Inside the outer try: an alarm that fires just before it is
      # cleared still lands in the handler below.
      signal.setitimer(signal.ITIMER_REAL, 0)
  except _CallTimeout:
    return 0.0, "timeout"
  except Exception:  # pylint: disable=broad-except
    return 0.0, "error"
  if returns_any(score_fn):
    return score, "ok"
  if not 0.0 <= score <= 1.0:  # Also rejects NaN.
    return 0.0, "error"
  return score, "ok"


def _watch_parent(parent_pid: int) -> None:
  """Exits the worker when the process that started it is gone (a worker
  whose caller was killed must not run on)."""
  while True:
    time.sleep(1.0)
    if os.getppid() != parent_pid:
      os._exit(0)  # pylint: disable=protected-access


def worker_entry(fd: int, memory_bytes: int, parent_pid: int) -> None:
  """The worker process's main (see `_Worker`): serves the socket `fd`."""
  threading.Thread(target=_watch_parent, args=(parent_pid,),
                   daemon=True).start()
  _worker_main(mp_connection.Connection(fd), memory_bytes or None)


def _worker_main(conn, memory_bytes: Optional[int]) -> None:
  """A worker's loop: ("import", modules) and ("call", ...) messages."""
  _init_worker(memory_bytes)
  while True:
    try:
      message = conn.recv()
    except (EOFError, OSError):
      return  # The caller closed the pool (or died).
    if message[0] == "import":
      try:
        _import_modules(message[1])
        reply = ("ok", "")
      except BaseException as e:  # pylint: disable=broad-except
        reply = ("import_error", f"{type(e).__name__}: {e}")
    else:
      _, score_fn, prediction, reference, timeout_s = message
      reply = _pooled_call(score_fn, prediction, reference, timeout_s)
    conn.send(reply)


# ---------------------------------------------------------------------------
# Caller side.

class CallResult(NamedTuple):
  """What happened to one pooled call.

  Attributes:
    score: the score (0.0 unless status is "ok").
    status: "ok", "timeout", "error" (the scorer raised) or "crash" (the
      worker died).
    seconds: wall time from sending the call to its outcome.
  """
  score: float
  status: str
  seconds: float


# A worker is a fresh interpreter that imports this module and what its
# calls need, not the caller's main module (multiprocessing's spawn and
# forkserver children import it, e.g. the whole training program).
_WORKER_MAIN = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
                "from rl_rewards.tasks import verifiers; "
                "verifiers.worker_entry(*map(int, sys.argv[2:]))")
_LIVE_WORKERS = weakref.WeakSet()


def live_worker_pids() -> list[int]:
  """Process ids of every worker not yet stopped, in all pools."""
  return sorted(w.process.pid for w in list(_LIVE_WORKERS))


class _Worker:
  """One worker process, its socket, and what it is doing."""

  def __init__(self, memory_bytes, modules):
    ours, theirs = socket.socketpair()
    try:
      self.process = subprocess.Popen(
          [sys.executable, "-c", _WORKER_MAIN, json.dumps(sys.path),
           str(theirs.fileno()), str(memory_bytes or 0), str(os.getpid())],
          pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    finally:
      theirs.close()  # So that the worker's death reads as EOF here.
    self.conn = mp_connection.Connection(ours.detach())
    _LIVE_WORKERS.add(self)
    self.modules = set(modules)
    self.item = None
    self.start_import(modules)

  def start_import(self, modules):
    self.modules |= set(modules)
    self.conn.send(("import", tuple(sorted(self.modules))))
    self.state, self.since = "starting", time.monotonic()

  def kill(self):
    if self.process.poll() is None:
      self.process.kill()
    try:
      self.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      pass
    self.conn.close()
    _LIVE_WORKERS.discard(self)


class VerifierPool:
  """Worker processes for the third-party verifiers.

  Workers start lazily as fresh interpreters (`_WORKER_MAIN`), import the
  verifier library once (untimed), and run one call at a time,
  each under an alarm of `timeout_s`. The caller hands each idle worker the
  next call and watches every busy one: a call still running
  `KILL_GRACE_S` after its alarm (e.g. stuck in C code) is killed with its
  worker, a worker that dies mid-call (a crash, the memory cap) loses only
  that call, and either way a fresh worker takes its place (started when
  there is work for it) while the others go on. A call therefore takes at most `timeout_s + KILL_GRACE_S`.

  Attributes:
    num_workers: worker processes.
    memory_bytes: address-space cap per worker (None for no cap).
    restarts: workers killed or lost and replaced so far.
  """

  def __init__(self, num_workers: Optional[int] = None,
               memory_bytes: Optional[int] = DEFAULT_WORKER_MEMORY_BYTES):
    self.num_workers = num_workers or max(1, min(2, os.cpu_count() or 1))
    self.memory_bytes = memory_bytes
    self._workers = []
    self._lock = threading.Lock()
    self.restarts = 0

  def worker_pids(self) -> list[int]:
    """Process ids of the live workers."""
    return [w.process.pid for w in self._workers]

  def kill(self) -> None:
    """Stops all workers now, including ones stuck in a call."""
    workers, self._workers = self._workers, []
    for worker in workers:
      worker.kill()

  def _lose(self, worker) -> None:
    worker.kill()
    self._workers.remove(worker)
    self.restarts += 1

  def _startup_failure(self, message: str) -> None:
    self.kill()
    raise RuntimeError(f"verifier workers: {message}")

  def run(self, score_fn, items: Sequence[tuple[int, str, Any]], *,
          timeout_s: float, modules: Sequence[str] = (),
          startup_timeout_s: float = 120.0
          ) -> tuple[dict[int, float], int, int]:
    """`run_detailed`, summed up: (scores, timeouts, errors + crashes)."""
    results = self.run_detailed(score_fn, items, timeout_s=timeout_s,
                                modules=modules,
                                startup_timeout_s=startup_timeout_s)
    statuses = collections.Counter(r.status for r in results.values())
    return ({position: r.score for position, r in results.items()},
            statuses["timeout"], statuses["error"] + statuses["crash"])

  def run_detailed(self, score_fn, items: Sequence[tuple[int, str, Any]], *,
                   timeout_s: float, modules: Sequence[str] = (),
                   startup_timeout_s: float = 120.0) -> dict[int, CallResult]:
    """Scores `items` in the workers.

    Args:
      score_fn: a picklable (module-level) function (prediction, reference)
        -> float in [0, 1].
      items: (position, prediction, reference) triples.
      timeout_s: time limit per call.
      modules: modules the workers import before their first timed call.
      startup_timeout_s: time allowed for starting a worker and its imports.

    Returns:
      The outcome of every item, by position.

    Raises:
      RuntimeError: if the workers cannot start or import `modules` (e.g.
        math-verify is not installed).
    """
    with self._lock:
      if not items:
        return {}
      # Workers import score_fn's module to unpickle it: warm that up too.
      fn_module = getattr(getattr(score_fn, "func", score_fn), "__module__",
                          None)
      modules = set(modules) | ({fn_module} if fn_module else set())
      for worker in list(self._workers):
        if worker.state == "idle" and not modules <= worker.modules:
          try:
            worker.start_import(modules)
          except (BrokenPipeError, ConnectionError, EOFError):
            self._lose(worker)  # Died while idle: replaced below.
      queue = collections.deque(items)
      results = {}
      while True:
        while queue and len(self._workers) < self.num_workers:
          self._workers.append(_Worker(self.memory_bytes, modules))
        for worker in list(self._workers):
          if worker.state == "idle" and queue:
            position, prediction, reference = queue.popleft()
            try:
              worker.conn.send(("call", score_fn, prediction, reference,
                                timeout_s))
            except (BrokenPipeError, ConnectionError, EOFError):
              queue.appendleft((position, prediction, reference))
              self._lose(worker)  # Died while idle: nothing lost.
              continue
            worker.state, worker.since = "busy", time.monotonic()
            worker.item = position
        if queue and len(self._workers) < self.num_workers:
          continue  # A worker was lost while idle: start its replacement.
        active = [w for w in self._workers if w.state != "idle"]
        if not queue and not any(w.state == "busy" for w in active):
          return results

        def deadline(worker):
          return worker.since + (startup_timeout_s if worker.state ==
                                 "starting" else timeout_s + KILL_GRACE_S)

        wait_s = min(deadline(w) for w in active) - time.monotonic()
        ready = mp_connection.wait([w.conn for w in active],
                                   timeout=max(0.0, wait_s))
        now = time.monotonic()
        for worker in active:
          elapsed = now - worker.since
          if worker.conn in ready:
            try:
              reply = worker.conn.recv()
            except (EOFError, OSError):
              reply = None  # The worker died.
          elif now >= deadline(worker):
            reply = "deadline"
          else:
            continue
          if worker.state == "starting":
            if reply is None or reply == "deadline":
              self._startup_failure(
                  f"a worker {'exited' if reply is None else 'timed out'} "
                  f"while importing {sorted(modules)}.")
            if reply[0] != "ok":
              self._startup_failure(
                  f"cannot import {sorted(modules)}: {reply[1]}")
            worker.state = "idle"
            continue
          if reply is None or reply == "deadline":
            status = "crash" if reply is None else "timeout"
            results[worker.item] = CallResult(0.0, status, elapsed)
            self._lose(worker)
          else:
            score, status = reply
            results[worker.item] = CallResult(score, status, elapsed)
            worker.state = "idle"

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


def _reference_text(kind: str, reference: Any, i: int) -> str:
  if kind == "reasoning_gym":
    if not isinstance(reference, dict) or "answer" not in reference:
      raise ValueError(
          f"reference {i}: reasoning_gym references must be reasoning-gym "
          "entries (dicts with 'answer' and 'metadata'), got "
          f"{type(reference).__name__}.")
    return str(reference["answer"])
  if not isinstance(reference, str):
    raise ValueError(f"reference {i}: {kind} references must be str, got "
                     f"{type(reference).__name__}.")
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
    predictions: N model answers; None (e.g. no answer extracted) scores 0,
      and so does anything else that is not a str (counted as wrong_type).
    references: N references: strings, or reasoning-gym entries for
      "reasoning_gym" (the dataset is rebuilt from
      `entry["metadata"]["source_dataset"]` with its default config).
    timeout_s: time limit per call for the pooled kinds.
    max_chars: predictions longer than this score 0 (counted as oversize).
    max_depth: predictions with deeper bracket nesting score 0 (oversize).
    threshold: reasoning-gym scores >= threshold count as 1 (its partial
      credit, e.g. 0.125 for a wrong sum, counts as 0).
    pool: the worker pool for pooled kinds; defaults to a shared one.

  Returns:
    (scores float32 [N] of 0.0/1.0, stats).

  Raises:
    ValueError: on an unknown kind, mismatched lengths or a reference of
      the wrong type (naming its index).
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
    reference_text = _reference_text(kind, reference, i)
    if prediction is None:
      continue
    if not isinstance(prediction, str):
      stats.wrong_type += 1
      continue
    if (_too_big(prediction, max_chars, max_depth) or
        _too_big(reference_text, max_chars, max_depth)):
      stats.oversize += 1
      continue
    if kind in _IN_PROCESS_SCORERS:
      start = time.perf_counter()
      try:
        scores[i] = _IN_PROCESS_SCORERS[kind](prediction, reference_text)
      except Exception:  # pylint: disable=broad-except
        stats.errors += 1
      stats.max_call_s = max(stats.max_call_s, time.perf_counter() - start)
    else:
      pending.append((i, prediction, reference))
  if pending:
    pool = pool or default_pool()
    if kind == "math":
      score_fn = _math_verify_score
    else:
      score_fn = functools.partial(_reasoning_gym_score, threshold=threshold)
    results = pool.run_detailed(score_fn, pending, timeout_s=timeout_s,
                                modules=_POOLED_MODULES[kind])
    for position, result in results.items():
      scores[position] = result.score
      stats.timeouts += result.status == "timeout"
      stats.errors += result.status == "error"
      stats.crashes += result.status == "crash"
      stats.max_call_s = max(stats.max_call_s, result.seconds)
  return scores, stats
