"""`experiments/plot.py` and `rl_rewards/run_plots.py` on a synthetic run."""

import json
import os
import subprocess
import sys

import pytest

from rl_rewards import run_plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(workdir):
  records = []
  for step in (25, 50):
    records.append({"stage": "sft", "step": step, "time/compute_s": step / 5,
                    "train/loss": 2.0 / step, "perf/tokens_per_sec": 3000.0})
  records.append({"stage": "sft", "step": 50, "eval/accuracy": 0.4,
                  "eval/mean_length": 49.0, "eval/steps_per_response": 5.0,
                  "eval/pass@8": 0.7})
  records.append({"stage": "labels", "step": 1, "labels/q_mean": 0.25,
                  "labels/hard_vs_oracle": 0.8, "time/shard_s": 20.0,
                  "labels/path": "/tmp/x"})
  records.append({"stage": "rl", "step": 0, "eval/accuracy": 0.4})
  for step in (1, 2, 3):
    records.append({
        "stage": "rl", "step": step, "train/reward_mean": 0.3 + step / 10,
        "train/response_length": 50.0, "train/steps_per_response": 5.0,
        "prm/verifier_agreement": 0.6, "prm/step_label_agreement": "nan",
        "time/rollout_s": 1.0, "time/update_s": 0.5,
        "perf/tokens_per_sec": 2000.0})
  records.append({"stage": "rl", "step": 3, "eval/accuracy": 0.5,
                  "train/reward_mean": 9.0})  # A repeat: the first value wins.
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for record in records:
      f.write(json.dumps(dict(record, time=0.0)) + "\n")


def test_curves_per_stage_keep_the_first_value_at_a_step(tmp_path):
  _write_run(tmp_path)
  from rl_rewards import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  curves = run_plots.run_curves(metrics_lib.read_metrics(tmp_path))
  assert list(curves) == ["sft", "labels", "rl"]
  assert curves["rl"]["train/reward_mean"] == ([1, 2, 3], [0.4, 0.5, 0.6])
  assert curves["rl"]["eval/accuracy"] == ([0, 3], [0.4, 0.5])
  assert "labels/path" not in curves["labels"]


def test_every_panel_of_every_stage(tmp_path):
  _write_run(tmp_path)
  from rl_rewards import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  fig = run_plots.figure(metrics_lib.read_metrics(tmp_path))
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert titles == [f"{stage}: {panel}" for stage, first in (
      ("sft", "loss"), ("labels", "label value"), ("rl", "reward"))
                    for panel in (first,) + run_plots.PANELS[1:]]
  by_title = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}

  def labels(title):
    return sorted(line.get_label() for line in by_title[title].get_lines())

  assert labels("rl: held-out accuracy") == ["eval/accuracy"]
  assert labels("rl: verifier agreement") == ["prm/verifier_agreement"]
  assert labels("rl: time per phase") == ["time/rollout_s", "time/update_s"]
  assert labels("rl: tokens/s") == ["perf/tokens_per_sec"]
  assert labels("sft: held-out accuracy") == ["eval/accuracy", "eval/pass@8"]
  assert labels("labels: verifier agreement") == ["labels/hard_vs_oracle"]
  assert labels("labels: held-out accuracy") == []  # "not logged".


def test_plot_command_writes_a_png(tmp_path):
  _write_run(tmp_path)
  out = subprocess.run(
      [sys.executable, "-m", "experiments.plot", f"--workdir={tmp_path}"],
      capture_output=True, text=True, check=True, cwd=ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  path = os.path.join(tmp_path, "curves.png")
  assert out.stdout.strip() == path
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_metrics_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="has no metrics"):
    run_plots.plot_run(str(tmp_path))
