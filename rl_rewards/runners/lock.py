"""One run per workdir: an exclusive lock on `<workdir>/run.lock`.

    with lock.hold(workdir):
      ...  # the whole run

The lock is `fcntl.flock` on the file, which the kernel releases when the
holding process exits or is killed, so a lock left by a killed run is simply
taken over; the file keeps the holder's pid, host and start time, for the
error a second run gets while the first one is alive. In a multi-process run
only process 0 takes it (the others run under process 0's lock). On network
file systems `flock` is only as good as the file system's lock support.
"""

import contextlib
import datetime
import fcntl
import json
import os
import socket

from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib

LOCK_FILE = "run.lock"


class WorkdirInUseError(config_lib.ConfigError):
  """Another live process is running in the workdir."""


def _holder_text(text: str) -> str:
  try:
    holder = json.loads(text)
    return (f"process {holder['pid']} on host {holder['host']} (started "
            f"{holder['started']})")
  except (ValueError, KeyError, TypeError):
    return "another process"


def acquire(workdir: str):
  """Takes the workdir's lock; returns the open lock file (close to release).

  Raises:
    WorkdirInUseError naming the holder when another live process has it.
  """
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  f = os.fdopen(fd, "r+")
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _holder_text(f.read())
    f.close()
    raise WorkdirInUseError(
        f"workdir {workdir} is in use by {holder}; wait for that run to "
        "finish (or stop it), or use another --workdir.") from None
  previous = f.read()
  if previous.strip():
    print(f"[run] taking over the lock of a run that is no longer alive: "
          f"{_holder_text(previous)}", flush=True)
  f.seek(0)
  f.truncate()
  f.write(json.dumps({
      "pid": os.getpid(), "host": socket.gethostname(),
      "started": datetime.datetime.now().isoformat(timespec="seconds")}))
  f.flush()
  return f


def release(f):
  """Releases a lock from `acquire` (clears the holder, then unlocks)."""
  f.seek(0)
  f.truncate()
  f.flush()
  f.close()


@contextlib.contextmanager
def hold(workdir: str):
  """Holds the workdir's lock for the block (process 0 only)."""
  if not metrics_lib.is_primary():
    yield
    return
  f = acquire(workdir)
  try:
    yield
  finally:
    release(f)
