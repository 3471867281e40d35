"""A run that kills itself, launched by `live_views_test.py`.

    python tests/runners/live_views_worker.py STAGE:STEP [train.py flags...]

Runs `experiments/train.py` as a user would, and sends itself SIGKILL right
after the metrics record of STAGE at STEP is written (no cleanup runs: files
stay as a kill leaves them). `-` as STAGE:STEP runs to the end.
"""

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from rl_rewards import metrics as metrics_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def install_kill(stage: str, step: int):
  write = metrics_lib.MetricsWriter.write

  def write_then_kill(self, s, st, values):
    write(self, s, st, values)
    if s == stage and int(st) == step and "train/loss" in values:
      os.kill(os.getpid(), signal.SIGKILL)

  metrics_lib.MetricsWriter.write = write_then_kill


if __name__ == "__main__":
  from experiments import train  # pylint: disable=g-import-not-at-top
  from rl_rewards import cli  # pylint: disable=g-import-not-at-top
  if sys.argv[1] != "-":
    kill_stage, _, kill_step = sys.argv[1].partition(":")
    install_kill(kill_stage, int(kill_step))
  sys.argv = [sys.argv[0]] + sys.argv[2:]
  cli.run(train.main)
