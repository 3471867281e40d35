"""Named kill points: a debug hook that SIGKILLs the process at a chosen moment.

The fault-injection benchmark (`experiments/benchmarks/faults.py`) proves
that a run killed at any moment resumes exactly. Random wall-clock kills
rarely land inside the short writes that matter most, so the few places that
write the run's files call `point(name)`:

  checkpoint.save    a checkpoint is about to be written (with a delay: inside
                     the write)
  checkpoint.saved   a checkpoint is written (asynchronous saves: still in
                     flight)
  checkpoint.done    a stage's done marker is written, not yet renamed
  labels.shard       a label shard is written, not yet renamed
  metrics.write      half of a metrics record is written (a torn line)
  json.write         config.json or summary.json is written, not yet renamed
  episodes.turn      a multi-turn rollout is between two turns (the cache
                     and the environments' state only in memory)

With `RL_REWARDS_KILL_AT=NAME:N[:DELAY]` in the environment, the process
kills itself with SIGKILL at the N-th call of `point(NAME)` (counted from 1
in this process), after DELAY seconds if given (from a timer thread, so the
kill lands inside whatever follows). With `RL_REWARDS_KILL_TRACE=PATH`,
every call appends `{"name", "count", "pid"}` to PATH (one JSON object a
line), which tells the benchmark how many of each point a run passes.
Without these variables `point` only looks up a dict: nothing else happens.
"""

import json
import os
import signal
import threading

KILL_ENV = "RL_REWARDS_KILL_AT"
TRACE_ENV = "RL_REWARDS_KILL_TRACE"
NAMES = ("checkpoint.save", "checkpoint.saved", "checkpoint.done",
         "labels.shard", "metrics.write", "json.write",
         "episodes.turn")

_counts: dict[str, int] = {}
_config = None  # (name, n, delay) or (), parsed once.


def parse(spec: str):
  """`NAME:N[:DELAY]` -> (name, n, delay seconds); ValueError naming it."""
  parts = spec.split(":")
  if len(parts) not in (2, 3) or parts[0] not in NAMES:
    raise ValueError(f"{KILL_ENV}={spec!r}: expected NAME:N[:DELAY] with NAME "
                     f"one of {', '.join(NAMES)}.")
  try:
    n = int(parts[1])
    delay = float(parts[2]) if len(parts) == 3 else 0.0
  except ValueError:
    raise ValueError(f"{KILL_ENV}={spec!r}: N must be an int and DELAY a "
                     "number of seconds.") from None
  if n < 1 or delay < 0:
    raise ValueError(f"{KILL_ENV}={spec!r}: need N >= 1 and DELAY >= 0.")
  return parts[0], n, delay


def _armed():
  global _config
  if _config is None:
    spec = os.environ.get(KILL_ENV, "")
    _config = parse(spec) if spec else ()
  return _config


def kill_now():
  os.kill(os.getpid(), signal.SIGKILL)


def point(name: str, before_kill=None):
  """Marks a kill point; kills the process here if the environment says so.

  Args:
    name: one of `NAMES`.
    before_kill: called just before an immediate kill (e.g. to write half a
      record, as a real kill in the middle of a write would leave it).
  """
  if not (_armed() or os.environ.get(TRACE_ENV)):
    return
  count = _counts[name] = _counts.get(name, 0) + 1
  trace = os.environ.get(TRACE_ENV)
  if trace:
    with open(trace, "a") as f:
      f.write(json.dumps({"name": name, "count": count,
                          "pid": os.getpid()}) + "\n")
  if _config and _config[0] == name and _config[1] == count:
    if _config[2] > 0:
      timer = threading.Timer(_config[2], kill_now)
      timer.daemon = True
      timer.start()
      return
    if before_kill is not None:
      before_kill()
    kill_now()


def reset():
  """Forgets the counts and re-reads the environment: a new process, as far
  as kill points go (tests run several "processes" in one)."""
  global _config
  _counts.clear()
  _config = None
