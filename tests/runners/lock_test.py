"""One run per workdir: refused while alive, taken over once killed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rl_rewards import cli
from rl_rewards.runners import lock
from rl_rewards.runners import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _holder(workdir):
  """A process holding the workdir's lock until killed."""
  proc = subprocess.Popen(
      [sys.executable, "-c",
       "import sys, time\nfrom rl_rewards.runners import lock\n"
       f"held = lock.acquire({workdir!r})\nprint('locked', flush=True)\n"
       "time.sleep(120)\n"],
      cwd=ROOT, stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "locked\n"
  return proc


def test_a_second_run_is_refused_then_takes_over_a_killed_holder(tmp_path,
                                                                 capsys):
  workdir = str(tmp_path / "run")
  holder = _holder(workdir)
  try:
    with pytest.raises(lock.WorkdirInUseError,
                       match=rf"in use by process {holder.pid} on host .*"
                       r"another --workdir"):
      lock.acquire(workdir)
    config = cli.load_config_file(
        os.path.join(ROOT, "configs", "default.py") + ":size=test")
    with pytest.raises(lock.WorkdirInUseError):
      pipeline.run(config, workdir)
    assert not os.path.exists(os.path.join(workdir, "config.json"))
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  capsys.readouterr()
  f = lock.acquire(workdir)  # The kernel released the dead holder's lock.
  assert f"process {holder.pid}" in capsys.readouterr().out
  assert str(os.getpid()) in open(os.path.join(workdir, lock.LOCK_FILE)).read()
  lock.release(f)
  with lock.hold(workdir):  # Released: free again, nothing to take over.
    pass
  assert "taking over" not in capsys.readouterr().out


def test_the_lock_is_released_when_the_run_fails(tmp_path):
  workdir = str(tmp_path / "run")
  with pytest.raises(RuntimeError):
    with lock.hold(workdir):
      raise RuntimeError("stage failed")
  start = time.time()
  lock.release(lock.acquire(workdir))
  assert time.time() - start < 5
