"""The loop of docs/prm_files.md through the command line, on a tiny random
hub-format checkpoint with its chat template: a head PRM trained from a
TRL-layout file (`configs/prm.py:data=file`), then `eval_prm` on a
ProcessBench-format file and Best-of-N on a GSM8K-layout file."""

import json
import os
import subprocess
import sys

import pytest

from rl_rewards import cli
from rl_rewards.runners import pipeline
from tests.prm import stepwise_files
from tests.runners import gsm8k_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.slow
def test_train_from_file_then_processbench_and_best_of_n(tmp_path):
  rows = stepwise_files.trl_rows(8)
  task_files = stepwise_files.gsm8k_task_files(tmp_path / "task")
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py") + ":data=file,size=test,"
      "model=head")
  config.model.hf_path = stepwise_files.checkpoint(tmp_path / "checkpoint")
  config.task.train_path = task_files["train"]
  config.task.eval_path = task_files["eval"]
  config.prm.train_path = stepwise_files.write(tmp_path / "train.jsonl",
                                               rows)
  workdir = str(tmp_path / "prm_file")
  pipeline.run(config, workdir)
  # The TRL rows as a ProcessBench file: the first wrong step is the label.
  bench = stepwise_files.write(tmp_path / "gsm8k.jsonl", [
      {"id": i, "problem": r["prompt"], "steps": r["completions"],
       "label": r["labels"].index(False) if False in r["labels"] else -1}
      for i, r in enumerate(rows)])
  bon = stepwise_files.write(tmp_path / "bon.jsonl", gsm8k_files.ROWS[:2])
  out = str(tmp_path / "eval")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.eval_prm", f"--workdir={workdir}",
       f"--processbench={bench}", f"--bon_path={bon}", "--bon_samples=4",
       f"--output_dir={out}"], cwd=ROOT, capture_output=True, text=True,
      timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.load(open(os.path.join(out, "processbench.json")))
  assert (results["gsm8k"]["num_err"], results["gsm8k"]["num_cor"]) == (4, 4)
  assert 0.0 <= results["gsm8k"]["auroc"] <= 1.0
  best_of_n = json.load(open(os.path.join(out, "best_of_n.json")))
  assert best_of_n["prm_eval/problems"] == 2
  assert best_of_n["prm_eval/samples"] == 4
  for key in ("prm_eval/pass4", "prm_eval/bon4_majority",
              "prm_eval/bon4_min", "prm_eval/bon4_weighted_last"):
    assert 0.0 <= best_of_n[key] <= 1.0
  assert "| gsm8k | 8 | 4 | 4 |" in proc.stdout
  assert "Best-of-N on" in proc.stdout
