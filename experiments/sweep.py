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
import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib

_CONFIG = flags.DEFINE_string("config", None, "Config file (with get_sweep()).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Root directory of the sweep.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at the same time.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value config overrides for every point.")
flags.mark_flags_as_required(["config", "workdir"])

_COLUMNS = ("eval/accuracy", "eval/pass@8", "eval/step_accuracy")


def point_name(overrides: dict) -> str:
  if not overrides:
    return "base"
  return ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def load_sweep(spec: str):
  """The list of override dicts of `path.py[:arg]`'s get_sweep()."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = spec.partition(":")[0]
  cli.load_config_file(spec)  # Fails clearly on a bad path or config.
  module_spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep().")
  points = list(module.get_sweep())
  for point in points:
    config = cli.load_config_file(spec)
    for key in point:
      cli.check_override_key(config, key)
  return points


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


def collect(root, points):
  rows = []
  for overrides in points:
    workdir = os.path.join(root, point_name(overrides))
    path = os.path.join(workdir, metrics_lib.SUMMARY_FILE)
    summary = metrics_lib.read_json(path) if os.path.exists(path) else None
    rows.append({"point": point_name(overrides), "workdir": workdir,
                 "summary": summary})
  return rows


def markdown_table(rows) -> str:
  header = ["point", "SFT acc"] + [f"RL {c.split('/')[1]}" for c in _COLUMNS]
  header.append("wall s")
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for row in rows:
    summary = row["summary"]
    if summary is None:
      lines.append(f"| {row['point']} | failed |" + " |" * (len(header) - 2))
      continue
    stages = summary["stages"]
    sft = stages.get("sft", {}).get("eval/accuracy")
    rl = stages.get("rl", {})
    cells = [row["point"], _fmt(sft)] + [_fmt(rl.get(c)) for c in _COLUMNS]
    cells.append(f"{summary['wall_time_s']:.0f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _fmt(value):
  return "–" if value is None else f"{value:.3f}"


def main(argv):
  del argv
  points = load_sweep(_CONFIG.value)
  root = _WORKDIR.value
  os.makedirs(root, exist_ok=True)
  print(f"sweep: {len(points)} points from {_CONFIG.value} into {root}")
  with concurrent.futures.ThreadPoolExecutor(_PARALLEL.value) as pool:
    futures = {
        pool.submit(run_point, _CONFIG.value, point, _OVERRIDES.value,
                    os.path.join(root, point_name(point))): point
        for point in points}
    for future in concurrent.futures.as_completed(futures):
      code = future.result()
      print(f"  {point_name(futures[future])}: "
            f"{'done' if code == 0 else f'failed (exit {code})'}", flush=True)
  rows = collect(root, points)
  table = markdown_table(rows)
  with open(os.path.join(root, "sweep.md"), "w") as f:
    f.write(table + "\n")
  metrics_lib.write_json_atomic(os.path.join(root, "sweep.json"), rows)
  print(table)


if __name__ == "__main__":
  app.run(main)
