"""Runs the grid of a config's `get_sweep()`, one workdir per point.

    python -m experiments.sweep --config=configs/pav.py --workdir=runs/pav_sweep
    python -m experiments.sweep --config=configs/grpo.py:sft=runs/default \\
        --workdir=runs/grpo_lr --parallel=2 --override=rl.steps=50

Every point's config is built and checked first (`cli.point_config`, and the
checks a run makes before its first stage), so a bad key or value fails
before any point runs. Each point then runs `experiments.train` in its own
process (so points cannot affect each other) with the point's
`--config.key=value` overrides, in its own workdir under `<workdir>`, named
by the point's index in the grid and the values that vary across it
(`3-alpha=0.5,prover_k=4`; `cli.point_dirs`), with the point's full
overrides in its `point.json`. Finished points are reused (their workdir
resumes), so a sweep can be interrupted and restarted; a directory that holds
another point (the grid changed) stops the sweep before any run. At the end
the `summary.json` of every point is collected into `<workdir>/sweep.md` (a
markdown table) and `<workdir>/sweep.json`. When a point fails, the sweep
ends with a table of the failures (point, exit status, the last error line
of its `sweep_log.txt`) and exits with status 1.
"""

import concurrent.futures
import os
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports
from rl_rewards.runners import pipeline

_CONFIG = flags.DEFINE_string(
    "config", None, "Config file with a get_sweep() grid, path.py or "
    "path.py:arg (see configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory of the sweep.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at the same time.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value config overrides for every point.")
flags.mark_flags_as_required(["config", "workdir"])
LOG_FILE = "sweep_log.txt"


def run_point(spec, overrides, extra, workdir):
  """Runs one point; returns (exit status, its last error line or "")."""
  args = [sys.executable, "-m", "experiments.train", f"--config={spec}",
          f"--workdir={workdir}"]
  args += [f"--config.{k}={v}" for k, v in overrides.items()]
  args += [f"--config.{item}" for item in extra]
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOG_FILE)
  offset = os.path.getsize(path) if os.path.exists(path) else 0
  with open(path, "a") as log:
    result = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                            check=False)
  if result.returncode == 0:
    return 0, ""
  return result.returncode, cli.last_error_line(path, offset)


def check_points(spec, points, root, extra=()):
  """Builds and checks every point's config before any runs."""
  base = cli.load_config_file(spec)
  for item in extra:
    cli.check_override_key(base, item.split("=", 1)[0])
  for point, name in zip(points, cli.point_dirs(points)):
    config = cli.point_config(spec, point)
    try:
      pipeline.check_stages(config, os.path.join(root, name))
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(
          f"sweep point {cli.point_name(point)}: {e}") from None


def main(argv):
  del argv
  points = cli.load_sweep(_CONFIG.value)
  root = _WORKDIR.value
  check_points(_CONFIG.value, points, root, _OVERRIDES.value)
  os.makedirs(root, exist_ok=True)
  dirs = cli.point_dirs(points)
  full_names = dict(zip(dirs, map(cli.point_name, points)))
  for point, name in zip(points, dirs):  # Before any run: a changed grid.
    cli.write_point_file(os.path.join(root, name), _CONFIG.value, point)
  print(f"sweep: {len(points)} points from {_CONFIG.value} into {root}")
  failures = {}
  with concurrent.futures.ThreadPoolExecutor(_PARALLEL.value) as pool:
    futures = {
        pool.submit(run_point, _CONFIG.value, point, _OVERRIDES.value,
                    os.path.join(root, name)): name
        for point, name in zip(points, dirs)}
    for future in concurrent.futures.as_completed(futures):
      code, line = future.result()
      name = futures[future]
      print(f"  {name}: {'done' if code == 0 else f'failed (exit {code})'}",
            flush=True)
      if code:
        failures[name] = (code, line)
  rows = reports.collect_sweep(root, points)
  table = reports.sweep_table(rows)
  failed = [(full_names[name], *failures[name]) for name in dirs
            if name in failures]
  if failed:
    table += (f"\n\n{len(failed)} of {len(points)} points failed:\n\n"
              f"{cli.failure_table(failed)}")
  with open(os.path.join(root, "sweep.md"), "w") as f:
    f.write(table + "\n")
  metrics_lib.write_json_atomic(os.path.join(root, "sweep.json"), rows)
  print(table, flush=True)
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  cli.define_debug_flag()
  app.run(cli.reporting_errors(main))
