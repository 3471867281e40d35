"""Runs the grid of a config's `get_sweep()`, one workdir per point.

    python -m experiments.sweep --config=configs/pav.py --workdir=runs/pav_sweep
    python -m experiments.sweep --config=configs/grpo.py:sft=runs/default \\
        --workdir=runs/grpo_lr --parallel=2 --override=rl.steps=50

Each point runs `experiments.train` in its own process (so points cannot
affect each other) with the point's `--config.key=value` overrides, in its own
workdir `<workdir>/<point name>`; finished points are reused (their workdir
resumes), so a sweep can be interrupted and restarted. At the end the
`summary.json` of every point is collected into `<workdir>/sweep.md` (a
markdown table) and `<workdir>/sweep.json`.
"""

import concurrent.futures
import os
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports

_CONFIG = flags.DEFINE_string("config", None, "Config file (with get_sweep()).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory of the sweep.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at the same time.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value config overrides for every point.")
flags.mark_flags_as_required(["config", "workdir"])


def run_point(spec, overrides, extra, workdir):
  args = [sys.executable, "-m", "experiments.train", f"--config={spec}",
          f"--workdir={workdir}"]
  args += [f"--config.{k}={v}" for k, v in overrides.items()]
  args += [f"--config.{item}" for item in extra]
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "sweep_log.txt"), "a") as log:
    result = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                            check=False)
  return result.returncode


def main(argv):
  del argv
  points = cli.load_sweep(_CONFIG.value)
  root = _WORKDIR.value
  os.makedirs(root, exist_ok=True)
  print(f"sweep: {len(points)} points from {_CONFIG.value} into {root}")
  with concurrent.futures.ThreadPoolExecutor(_PARALLEL.value) as pool:
    futures = {
        pool.submit(run_point, _CONFIG.value, point, _OVERRIDES.value,
                    os.path.join(root, cli.point_name(point))): point
        for point in points}
    for future in concurrent.futures.as_completed(futures):
      code = future.result()
      print(f"  {cli.point_name(futures[future])}: "
            f"{'done' if code == 0 else f'failed (exit {code})'}", flush=True)
  rows = reports.collect_sweep(root, points)
  table = reports.sweep_table(rows)
  with open(os.path.join(root, "sweep.md"), "w") as f:
    f.write(table + "\n")
  metrics_lib.write_json_atomic(os.path.join(root, "sweep.json"), rows)
  print(table)


if __name__ == "__main__":
  app.run(main)
