"""The sweep and compare entry points: grids, tables and curves."""

import json
import os

import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "ppo", "prime",
                                  "oracle"])
def test_every_sweep_point_is_a_valid_config(name):
  points = cli.load_sweep(os.path.join(ROOT, "configs", f"{name}.py"))
  assert points
  for point in points:
    assert all("." in key for key in point)


def test_sweep_with_an_unknown_key_fails(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text(
      "from rl_rewards import config_lib\n"
      "def get_config(arg=None):\n  return config_lib.base_config()\n"
      "def get_sweep():\n  return [{'rl.learning_rat': 1.0}]\n")
  with pytest.raises(config_lib.ConfigError, match="learning_rat"):
    cli.load_sweep(str(path))


def _summary(workdir, sft, rl):
  os.makedirs(workdir, exist_ok=True)
  metrics_lib.write_summary(workdir, {
      "stages": {"sft": {"eval/accuracy": sft},
                 "rl": {"eval/accuracy": rl, "eval/pass@8": 0.9,
                        "eval/step_accuracy": 0.5}},
      "wall_time_s": 12.0})


def test_sweep_table_collects_summaries(tmp_path):
  points = [{"rl.learning_rate": 1e-4}, {"rl.learning_rate": 5e-5}]
  _summary(tmp_path / cli.point_name(points[0]), 0.4, 0.6)
  rows = reports.collect_sweep(str(tmp_path), points)
  table = reports.sweep_table(rows)
  assert "| rl.learning_rate=0.0001 | 0.400 | 0.600 | 0.900 | 0.500 | 12 |" in (
      table)
  assert "| rl.learning_rate=5e-05 | failed |" in table


def _write_curve(workdir, accuracies, batch=256):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, acc in enumerate(accuracies):
      f.write(json.dumps({"stage": "rl", "step": step * 10,
                          "samples": step * 10 * batch, "time/step_s": 2.0,
                          "eval/accuracy": acc}) + "\n")


def test_compare_samples_to_reach_the_baseline(tmp_path):
  # Baseline reaches its final 0.6 at 3 evals (7680 samples); the process
  # method reaches 0.6 at its first eval after the start (2560 samples): 3x.
  for seed in range(2):
    _write_curve(tmp_path / f"seed{seed}" / "grpo", [0.4, 0.5, 0.55, 0.6])
    _write_curve(tmp_path / f"seed{seed}" / "pav", [0.4, 0.6, 0.65, 0.7])
  results = reports.summarize_comparison(str(tmp_path), ["grpo", "pav"], 2, "grpo")
  assert results["grpo"]["samples_to_baseline_final"] == 7680
  assert results["pav"]["samples_to_baseline_final"] == 2560
  assert results["pav"]["sample_ratio"] == pytest.approx(3.0)
  np.testing.assert_allclose(results["pav"]["accuracy_mean"],
                             [0.4, 0.6, 0.65, 0.7])
  table = reports.comparison_table(results, "grpo")
  assert "| pav | 2 | 0.400 | 0.700 ± 0.000 | 2560 | 3.00× |" in table
  reports.plot_comparison(results, str(tmp_path / "plot.png"))
  assert os.path.getsize(tmp_path / "plot.png") > 1000
