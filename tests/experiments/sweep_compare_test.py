"""The sweep and compare entry points: grids, tables and curves."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import compare
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports
from rl_rewards.runners import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# Every config file with a grid, and the arguments that pick other grids
# and sizes.
SWEEP_SPECS = sorted(
    os.path.basename(path)
    for path in glob.glob(os.path.join(ROOT, "configs", "*.py"))
    if "def get_sweep" in open(path, encoding="utf-8").read()) + [
        "prm.py:sweep=budget", "prm.py:size=test,sweep=budget",
        "prm.py:size=small,sweep=budget", "prm.py:size=test"]


def test_the_configs_with_grids_are_found():
  assert {"grpo.py", "prm.py", "pav.py"} <= set(SWEEP_SPECS)


@pytest.mark.parametrize("spec", SWEEP_SPECS)
def test_every_sweep_point_is_a_valid_config(spec, tmp_path):
  # Each point applied to its config passes the config's validation and the
  # checks a run makes before its first stage.
  spec = os.path.join(ROOT, "configs", spec)
  points = cli.load_sweep(spec)
  assert points
  for point, name in zip(points, cli.point_dirs(points)):
    config = cli.point_config(spec, point)
    for key, value in point.items():
      node = config
      for part in key.split("."):
        node = node[part]
      assert node == value, key
    config_lib.validate(config)
    pipeline.check_stages(config, str(tmp_path / name))


def test_a_point_of_a_bad_value_fails_before_any_run(tmp_path):
  spec = os.path.join(ROOT, "configs", "prm.py:size=test")
  with pytest.raises(config_lib.ConfigError,
                     match="sweep point rl.group_size=0: config.rl.group_size"):
    cli.point_config(spec, {"rl.group_size": 0})
  with pytest.raises(config_lib.ConfigError, match="config.rl.group_size=2.5"):
    cli.point_config(spec, {"rl.group_size": 2.5})
  # More problems than the label set of the test size holds (8).
  config = cli.point_config(spec, {"prm.label_problems": 9})
  with pytest.raises(config_lib.ConfigError,
                     match="label_problems=9: the label set holds only 8"):
    pipeline.check_stages(config, str(tmp_path))


def test_a_sweep_with_failed_points_exits_non_zero_with_their_table(tmp_path):
  # The point's config is valid, but its run stops at the mesh check (the
  # tests' 8 devices do not make a 3-way mesh): exit 2, one error line.
  path = tmp_path / "grid.py"
  path.write_text(
      "from rl_rewards import config_lib\n"
      "from rl_rewards import config_presets\n"
      "def get_config(arg=None):\n"
      "  return config_presets.apply_size(config_lib.base_config(), 'test')\n"
      "def get_sweep():\n  return [{'mesh.data': 3}]\n")
  root = tmp_path / "sweep"
  result = subprocess.run(
      [sys.executable, "-m", "experiments.sweep", f"--config={path}",
       f"--workdir={root}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 1, result.stderr
  row = ("| mesh.data=3 | 2 | error: config.mesh: axis sizes {'data': 3, "
         "'fsdp': 1, 'tensor': 1} multiply to 3,")
  assert "1 of 1 points failed" in result.stdout
  assert row in result.stdout
  assert row in (root / "sweep.md").read_text()


def test_a_sweep_with_a_bad_point_fails_before_any_run(tmp_path):
  path = tmp_path / "grid.py"
  path.write_text(
      "from rl_rewards import config_lib\n"
      "from rl_rewards import config_presets\n"
      "def get_config(arg=None):\n"
      "  config = config_presets.apply_size(config_lib.base_config(), 'test')\n"
      "  config.stages = 'sft,labels,prm'\n"
      "  return config\n"
      "def get_sweep():\n"
      "  return [{'rl.steps': 3}, {'prm.label_problems': 64}]\n")
  root = tmp_path / "sweep"
  result = subprocess.run(
      [sys.executable, "-m", "experiments.sweep", f"--config={path}",
       f"--workdir={root}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: sweep point prm.label_problems=64: config.prm.label_problems="
      "64: the label set holds only 8 problems (config.labels.num_problems); "
      "use at most 8."]
  assert not root.exists()  # Not even the valid point ran.


def test_the_last_error_line_of_a_log_is_its_runs_own(tmp_path):
  log = tmp_path / "log.txt"
  log.write_text("error: an earlier run's\n")
  offset = os.path.getsize(log)
  with open(log, "a") as f:
    f.write("step 1\nerror: config.x: bad.\nwall time 3 s\n\n")
  assert cli.last_error_line(str(log), offset) == "error: config.x: bad."
  with open(log, "a") as f:
    f.write("Traceback (most recent call last):\n  ...\nKeyError: 'k'\n")
  offset2 = offset + len("step 1\nerror: config.x: bad.\nwall time 3 s\n\n")
  assert cli.last_error_line(str(log), offset2) == "KeyError: 'k'"
  assert cli.last_error_line(str(tmp_path / "none.txt")) == ""
  assert cli.failure_table([("a=1", 2, "error: x | y")]) == (
      "| run | exit | last error line |\n|---|---|---|\n"
      "| a=1 | 2 | error: x \\| y |")


def test_compare_reports_every_failed_run_with_its_error_line(
    tmp_path, monkeypatch):
  def fake_subprocess_run(args, stdout, **kwargs):
    del kwargs
    name = os.path.basename(args[args.index("-m") + 3].split("=", 1)[1])
    if name in ("labels", "grpo"):
      stdout.write(f"[{name}] step 1\nerror: {name} went wrong.\n")
      stdout.flush()
      return subprocess.CompletedProcess(args, 2 if name == "labels" else 1)
    os.makedirs(os.path.join(str(tmp_path), name), exist_ok=True)
    metrics_lib.write_json_atomic(
        os.path.join(str(tmp_path), name, metrics_lib.SUMMARY_FILE), {})
    return subprocess.CompletedProcess(args, 0)
  monkeypatch.setattr(compare.subprocess, "run", fake_subprocess_run)
  needs = {"sft": [], "labels": ["sft"], "grpo": ["sft"], "pav": ["labels"]}
  with pytest.raises(compare.RunsFailed) as raised:
    compare.run_all(_fake_runs(tmp_path, compare, needs), jobs=2)
  failed = {os.path.basename(w): (e.status, e.last_line)
            for w, e in raised.value.failures}
  assert failed == {"labels": (2, "error: labels went wrong."),
                    "grpo": (1, "error: grpo went wrong.")}
  table = raised.value.table()
  assert f"| {tmp_path / 'labels'} | 2 | error: labels went wrong. |" in table
  assert not (tmp_path / "pav").exists()  # It needs the failed label set.


def test_sweep_with_an_unknown_key_fails(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text(
      "from rl_rewards import config_lib\n"
      "from rl_rewards import config_presets\n"
      "def get_config(arg=None):\n  return config_lib.base_config()\n"
      "def get_sweep():\n  return [{'rl.learning_rat': 1.0}]\n")
  with pytest.raises(config_lib.ConfigError, match="learning_rat"):
    cli.load_sweep(str(path))


def test_the_budget_grid_sets_each_kinds_own_keys():
  points = cli.load_sweep(
      os.path.join(ROOT, "configs", "prm.py:sweep=budget,labels=runs/l"))
  kinds = {(p["prm.model"], p["prm.target"]) for p in points}
  assert len(kinds) == 7 and len(points) == 21
  assert {target for _, target in kinds} == {"soft", "hard", "progress",
                                               "prover"}
  assert {p["prm.label_problems"] for p in points} == {128, 256, 1024}
  for point in points:
    # The keys that follow from the kind are the point's, not the file's
    # defaults (generative, progress).
    generative = point["prm.model"] == "generative"
    assert point["prm.value_weight"] == (0.0 if generative else 1.0)
    assert point["prm.drop_after_first_negative"] == (
        point["prm.target"] in ("hard", "progress"))
  # At the test size the grid, and the label set its points make, stay the
  # test size's: 8 problems.
  spec = os.path.join(ROOT, "configs", "prm.py:size=test,sweep=budget")
  assert {p["prm.label_problems"] for p in cli.load_sweep(spec)} == {2, 4, 8}
  assert cli.load_config_file(spec).labels.num_problems == 8
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py:labels=runs/l"))
  assert config.stages == "sft,prm,prm_eval"
  assert config.labels.init_from == "runs/l"
  with pytest.raises(config_lib.ConfigError, match="sweep='nope'"):
    cli.load_sweep(os.path.join(ROOT, "configs", "prm.py:sweep=nope"))


def test_a_sweep_of_verifiers_tabulates_their_quality(tmp_path):
  points = [{"prm.label_problems": 128}, {"prm.label_problems": 1024}]
  os.makedirs(tmp_path / cli.point_dirs(points)[0])
  metrics_lib.write_summary(tmp_path / cli.point_dirs(points)[0], {
      "stages": {"sft": {"eval/accuracy": 0.3},
                 "prm": {"prm/label_problems": 128,
                         "prm/valid_auroc_vs_oracle": 0.61},
                 "prm_eval": {"prm_eval/auroc": 0.625, "prm_eval/f1": 0.25,
                              "prm_eval/bon16_min": 0.5,
                              "prm_eval/bon16_majority": 0.45}},
      "wall_time_s": 30.0})
  table = reports.sweep_table(reports.collect_sweep(str(tmp_path), points))
  assert "step AUROC" in table and "RL accuracy" not in table
  assert ("| prm.label_problems=128 | 128 | 0.610 | 0.625 | 0.250 | 0.500 | "
          "0.450 | 30 |") in table
  assert "| prm.label_problems=1024 | failed |" in table


def _summary(workdir, sft, rl):
  os.makedirs(workdir, exist_ok=True)
  metrics_lib.write_summary(workdir, {
      "stages": {"sft": {"eval/accuracy": sft},
                 "rl": {"eval/accuracy": rl, "eval/pass@8": 0.9,
                        "eval/step_accuracy": 0.5}},
      "wall_time_s": 12.0})


def test_sweep_table_collects_summaries(tmp_path):
  points = [{"rl.learning_rate": 1e-4}, {"rl.learning_rate": 5e-5}]
  _summary(tmp_path / cli.point_dirs(points)[0], 0.4, 0.6)
  rows = reports.collect_sweep(str(tmp_path), points)
  table = reports.sweep_table(rows)
  assert "| rl.learning_rate=0.0001 | 0.400 | 0.600 | 0.900 | 0.500 | 12 |" in (
      table)
  assert "| rl.learning_rate=5e-05 | failed |" in table


def _write_curve(workdir, accuracies, batch=256, finished=True):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, acc in enumerate(accuracies):
      f.write(json.dumps({"stage": "rl", "step": step * 10,
                          "samples": step * 10 * batch, "time/step_s": 2.0,
                          "eval/accuracy": acc}) + "\n")
  if finished:
    metrics_lib.write_summary(str(workdir), {"stages": {}})


def test_an_unfinished_run_is_left_out_of_the_comparison(tmp_path):
  for seed in range(2):
    _write_curve(tmp_path / f"seed{seed}" / "grpo", [0.4, 0.5, 0.55, 0.6])
  _write_curve(tmp_path / "seed0" / "pav", [0.4, 0.6, 0.65, 0.7])
  _write_curve(tmp_path / "seed1" / "pav", [0.4, 0.45], finished=False)
  results = reports.summarize_comparison(str(tmp_path), ["grpo", "pav"], 2,
                                         "grpo")
  assert results["pav"]["seeds"] == 1 and results["pav"]["seed_ids"] == [0]
  # The finished seed's curve is whole, not cut to the running one's length.
  assert results["pav"]["accuracy_mean"] == pytest.approx([0.4, 0.6, 0.65,
                                                           0.7])
  assert results["pav"]["reach"]["samples"]["per_seed"] == [
      pytest.approx(10 * 256 / (30 * 256))]


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
  # Per seed: 2560 of grpo's 7680 samples; the compute axis counts one
  # record's 2 s per evaluation here (4 s of grpo's 8 s).
  assert results["pav"]["reach"]["samples"]["per_seed"] == pytest.approx(
      [1 / 3, 1 / 3])
  assert results["pav"]["reach"]["compute"]["mean"] == pytest.approx(0.5)
  table = reports.comparison_table(results, "grpo")
  assert ("| pav | 2 | 0.400 | 0.700 ± 0.000 | 0.33 [0.33, 0.33]; "
          "0.33 / 0.33 | 0.50 [0.50, 0.50]; 0.50 / 0.50 |") in table
  reports.plot_comparison(results, str(tmp_path / "plot.png"))
  assert os.path.getsize(tmp_path / "plot.png") > 1000


def test_reach_is_paired_by_seed_and_counts_fixed_costs(tmp_path):
  # Seed 0: grpo ends at 0.6; pav reaches 0.6 at its 2nd evaluation.
  # Seed 1: grpo ends at 0.5; pav never reaches 0.5.
  _write_curve(tmp_path / "seed0" / "grpo", [0.4, 0.5, 0.55, 0.6])
  _write_curve(tmp_path / "seed0" / "pav", [0.4, 0.45, 0.6, 0.6])
  _write_curve(tmp_path / "seed1" / "grpo", [0.3, 0.4, 0.45, 0.5])
  _write_curve(tmp_path / "seed1" / "pav", [0.3, 0.35, 0.4, 0.45])
  for seed, labels_s in ((0, 2.0), (1, 6.0)):
    for name, stage in (("labels", "labels"), ("prm_soft", "prm")):
      os.makedirs(tmp_path / f"seed{seed}" / name)
      metrics_lib.write_summary(str(tmp_path / f"seed{seed}" / name),
                                {"stages": {}, "stage_time_s":
                                 {stage: labels_s}})
  costs = {"pav": [("labels", "labels"), ("prm_soft", "prm")]}
  results = reports.summarize_comparison(str(tmp_path), ["grpo", "pav"], 2,
                                         "grpo", fixed_costs=costs)
  reach = results["pav"]["reach"]
  assert reach["samples"]["per_seed"] == [pytest.approx(5120 / 7680), None]
  assert reach["samples"]["seeds_reached"] == 1
  assert "mean" not in reach["samples"]  # Not every seed reached it.
  # Seed 0's compute: 2 + 2 s of labels and verifier, then 6 s of RL to its
  # 3rd evaluation: 10 s against grpo's 8 s.
  assert reach["compute"]["per_seed"] == [pytest.approx(10 / 8), None]
  assert results["pav"]["seconds"][0] == pytest.approx(2 + (4 + 12) / 2)
  table = reports.comparison_table(results, "grpo")
  assert "0.67 / never (1 of 2 seeds)" in table


def test_sft_continued_baseline_is_compared_on_compute_only(tmp_path):
  _write_curve(tmp_path / "seed0" / "grpo", [0.4, 0.5, 0.55, 0.6])
  workdir = tmp_path / "seed0" / "sft_continue"
  os.makedirs(workdir)
  with open(workdir / "metrics.jsonl", "w") as f:
    for secs, acc in ((0.0, 0.4), (2.0, 0.5), (4.0, 0.7), (8.0, 0.8)):
      f.write(json.dumps({"stage": "sft_continue", "step": int(secs * 10),
                          "seconds": secs, "samples": int(secs * 640),
                          "eval/accuracy": acc}) + "\n")
  metrics_lib.write_summary(str(workdir), {"stages": {}})
  results = reports.summarize_comparison(
      str(tmp_path), ["grpo", "sft_continue"], 1, "grpo")
  reach = results["sft_continue"]["reach"]
  assert set(reach) == {"compute"}
  # 0.6 first reached at 4 s of SFT; grpo's whole run took 4 x 2 s.
  assert reach["compute"]["per_seed"] == [pytest.approx(4 / 8)]
  table = reports.comparison_table(results, "grpo")
  assert "| sft_continue | 1 | 0.400 | 0.800 ± 0.000 | – | 0.50 [0.50, 0.50]; 0.50 |" in table


def test_a_baseline_ending_on_a_dip_is_measured_by_its_last_evaluations(
    tmp_path):
  # grpo rises to 0.6 and ends on a dip at 0.5. Against its final accuracy
  # both methods "reach" it at the first evaluation after the start (1/3 of
  # grpo's 7680 samples); against the mean of its last 3 evaluations,
  # (0.5 + 0.6 + 0.5) / 3 = 0.533, both need 2 of its 3 evaluations.
  _write_curve(tmp_path / "seed0" / "grpo", [0.4, 0.5, 0.6, 0.5])
  _write_curve(tmp_path / "seed0" / "pav", [0.4, 0.5, 0.55, 0.6])
  final = reports.summarize_comparison(str(tmp_path), ["grpo", "pav"], 1,
                                       "grpo")
  last3 = reports.summarize_comparison(str(tmp_path), ["grpo", "pav"], 1,
                                       "grpo", target_evals=3)
  for method in ("grpo", "pav"):
    assert final[method]["reach"]["samples"]["per_seed"] == [
        pytest.approx(1 / 3)]
    assert last3[method]["reach"]["samples"]["per_seed"] == [
        pytest.approx(2 / 3)]
  assert last3["pav"]["samples_to_baseline_final"] == 5120
  table = reports.comparison_table(last3, "grpo", target_evals=3)
  assert "samples to reach grpo's mean of its last 3 evaluations" in table
  assert "| pav | 1 | 0.400 | 0.600 ± 0.000 | 0.67 [0.67, 0.67]; 0.67 |" in (
      table)


def test_baseline_target_is_the_mean_of_the_last_evaluations():
  assert reports.baseline_target([0.1, 0.4, 0.2]) == pytest.approx(0.2)
  assert reports.baseline_target([0.1, 0.4, 0.2], 2) == pytest.approx(0.3)
  # More evaluations than the curve has: the whole curve.
  assert reports.baseline_target([0.1, 0.4, 0.2], 5) == pytest.approx(0.7 / 3)
  with pytest.raises(ValueError, match="evals"):
    reports.baseline_target([0.1], 0)


def test_bootstrap_interval_brackets_the_mean():
  low, high = reports.bootstrap_interval([0.2, 0.3, 0.4, 0.5, 0.6])
  assert 0.2 <= low < 0.4 < high <= 0.6
  assert reports.bootstrap_interval([0.3, 0.3]) == (0.3, 0.3)


def test_compare_knows_its_methods_and_their_shared_costs():
  assert compare.method_spec("pav_gen") == ("pav", "verifier=generative", (),
                                            "pav_gen")
  assert compare.method_spec("rloo")[3] is None
  with pytest.raises(ValueError, match="unknown method 'nope'"):
    compare.method_spec("nope")
  costs = compare.fixed_costs(["grpo", "pav", "pure", "sft_continue"])
  assert costs == {"pav": [("labels", "labels"), ("prm_soft", "prm")],
                   "pure": [("labels", "labels"), ("prm_step", "prm")]}
  for label, (config, arg, _, verifier) in compare.METHODS.items():
    spec = f"configs/{config}.py:" + ",".join(
        a for a in ("regime=long_sparse", arg) if a)
    assert cli.load_config_file(os.path.join(ROOT, spec)).rl.method, label
    assert verifier is None or verifier in compare.VERIFIERS


def test_compare_knows_the_multiturn_methods(tmp_path):
  for label, (config, arg, _, verifier) in compare.MULTITURN_METHODS.items():
    spec = f"configs/{config}.py:" + ",".join(a for a in ("size=test", arg)
                                               if a)
    loaded = cli.load_config_file(os.path.join(ROOT, spec))
    assert loaded.task.name == "hidden_operands", label
    assert verifier is None or verifier in compare.VERIFIERS
  # "grpo" names another config on each task; igpo is multi-turn only.
  assert compare.method_spec("grpo", "multiturn")[:2] == ("multiturn",
                                                         "method=grpo")
  assert compare.method_spec("grpo")[:2] == ("grpo", "")
  with pytest.raises(ValueError, match="unknown method 'oracle_pav'"):
    compare.method_spec("oracle_pav")
  runs = compare.plan_seed(str(tmp_path), 0, ["grpo", "sft_continue"],
                           size="test", regime="standard", overrides=[],
                           eval_every=5, sft_root="", baseline="grpo",
                           task="multiturn")
  specs = {os.path.basename(r.workdir): r.config_spec for r in runs}
  assert specs["sft"] == "configs/multiturn.py:size=test,regime=standard"
  assert specs["grpo"].startswith("configs/multiturn.py:size=test,")
  assert specs["grpo"].endswith(",method=grpo")
  assert specs["sft_continue"] == specs["sft"]


def test_a_seeds_plan_orders_each_run_after_what_it_needs(tmp_path):
  root = str(tmp_path)
  runs = compare.plan_seed(root, 1, ["grpo", "pav", "tp_grpo", "sft_continue"],
                           size="test", regime="long_sparse", overrides=["x=1"],
                           eval_every=5, sft_root="", baseline="grpo")
  base = os.path.join(root, "seed1")
  by_dir = {os.path.relpath(r.workdir, base): r for r in runs}
  sft = os.path.join(base, "sft")
  assert by_dir["sft"].needs == ()
  assert by_dir["grpo"].needs == (sft,)
  assert by_dir["labels"].needs == (sft,)
  assert by_dir["prm_soft"].needs == (os.path.join(base, "labels"),)
  assert by_dir["prm_step"].needs == (os.path.join(base, "labels"),)
  assert by_dir["pav"].needs == (sft, os.path.join(base, "prm_soft"))
  assert by_dir["tp_grpo"].needs == (sft, os.path.join(base, "prm_step"))
  assert f"prm={os.path.join(base, 'prm_step')}" in by_dir["tp_grpo"].config_spec
  assert by_dir["sft_continue"].budget_from == os.path.join(base, "grpo")
  assert os.path.join(base, "grpo") in by_dir["sft_continue"].needs
  assert all(r.overrides[:2] == ("seed=1", "x=1") for r in runs)
  assert by_dir["pav"].overrides[-1] == "rl.eval_every_steps=5"
  # Every run is listed after the runs it needs (the shared label set twice).
  seen = set()
  for r in runs:
    assert set(r.needs) <= seen, r.workdir
    seen.add(r.workdir)


def _fake_runs(tmp_path, compare, needs):
  """Runs named by `needs` ({name: [names it needs]}) under tmp_path."""
  path = lambda n: str(tmp_path / n)
  return [compare.Run(path(n), "configs/grpo.py", (),
                      tuple(path(m) for m in ms)) for n, ms in needs.items()]


def _fake_train(log, lock, fail=(), meet=(), barrier=None):
  """A stand-in for a training run: records its start and end, writes the
  summary that marks a run finished; the runs named in `meet` wait for each
  other at `barrier`, which breaks unless they run at once."""
  def train(run):
    name = os.path.basename(run.workdir)
    with lock:
      log.append(("start", name))
    if name in meet:
      barrier.wait(timeout=10)
    if name in fail:
      raise RuntimeError(f"{name} failed")
    os.makedirs(run.workdir, exist_ok=True)
    metrics_lib.write_json_atomic(
        os.path.join(run.workdir, metrics_lib.SUMMARY_FILE), {})
    with lock:
      log.append(("end", name))
  return train


def test_runs_start_only_after_what_they_need_and_run_side_by_side(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  needs = {"sft": [], "labels": ["sft"], "prm": ["labels"], "grpo": ["sft"],
           "pav": ["sft", "prm"], "cont": ["grpo"]}
  runs = _fake_runs(tmp_path, compare, needs)
  log, lock = [], threading.Lock()
  # labels and grpo both need only sft: with two jobs they must overlap, and
  # each waits at a two-party barrier that breaks if they do not.
  barrier = threading.Barrier(2)
  compare.run_all(runs + runs[:2], jobs=2,
                  train=_fake_train(log, lock, meet=("labels", "grpo"),
                                    barrier=barrier))
  assert not barrier.broken
  assert sorted(n for e, n in log if e == "start") == sorted(needs)
  for name, required in needs.items():
    start = log.index(("start", name))
    for m in required:
      assert log.index(("end", m)) < start, (name, m)


def test_one_job_runs_in_the_given_order(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  needs = {"sft": [], "b": ["sft"], "a": ["sft"], "c": []}
  log, lock = [], threading.Lock()
  compare.run_all(_fake_runs(tmp_path, compare, needs), jobs=1,
                  train=_fake_train(log, lock))
  assert log == [(e, n) for n in ("sft", "b", "a", "c")
                 for e in ("start", "end")]


def test_a_failed_run_stops_what_needs_it_and_is_raised(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  needs = {"sft": [], "labels": ["sft"], "pav": ["labels"], "grpo": ["sft"]}
  log, lock = [], threading.Lock()
  with pytest.raises(RuntimeError, match="labels failed"):
    compare.run_all(_fake_runs(tmp_path, compare, needs), jobs=1,
                    train=_fake_train(log, lock, fail=("labels",)))
  started = [n for e, n in log if e == "start"]
  assert started == ["sft", "labels"]  # Nothing starts after a failure.
  # A finished run is reused: rerunning starts from the failed one.
  log.clear()
  compare.run_all(_fake_runs(tmp_path, compare, needs), jobs=1,
                  train=_fake_train(log, lock))
  assert [n for e, n in log if e == "start"] == ["labels", "pav", "grpo"]


def test_a_run_needing_an_unplanned_run_is_refused(tmp_path):
  runs = _fake_runs(tmp_path, compare, {"pav": ["prm"]})
  with pytest.raises(ValueError, match="needs .*prm, which is neither"):
    compare.run_all(runs, jobs=2, train=lambda run: None)


@pytest.mark.slow
def test_compare_runs_a_regime_end_to_end(tmp_path, monkeypatch):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(ROOT)
  root = tmp_path / "cmp"
  subprocess.run(
      [sys.executable, "-m", "experiments.compare", "--size=test",
       "--regime=long_sparse", "--methods=grpo,pav,oracle,sft_continue",
       "--seeds=1", "--eval_every_steps=1", f"--workdir={root}"],
      check=True, capture_output=True, text=True)
  written = json.loads((root / "compare.json").read_text())
  results = written["methods"]
  assert set(results) == {"grpo", "pav", "oracle", "sft_continue"}
  assert written["regime"]["seeds"][0]["seed"] == 0
  assert written["target_evals"] == 1  # The final accuracy is the target.
  assert results["grpo"]["reach"]["samples"]["per_seed"][0] is not None
  table = (root / "compare.md").read_text()
  assert table.startswith("regime long_sparse")
  assert "all-wrong groups" in table
  # The verifier's quality; at this size its label set has no right step,
  # so its AUROCs are not measured.
  assert "| prm_soft | head, soft | – | – | – |" in table
  assert [r["name"] for r in written["verifiers"]] == ["prm_soft"]
  config = json.loads((root / "seed0" / "pav" / "config.json").read_text())
  assert config["task"]["max_ops"] == 9 and config["rl"]["eval_every_steps"] == 1


def test_regime_statistics_read_sft_and_the_baseline_run(tmp_path):
  sft = tmp_path / "seed0" / "sft"
  os.makedirs(sft)
  metrics_lib.write_summary(str(sft), {
      "stages": {"sft": {"eval/accuracy": 0.21, "sft/steps": 900,
                         "sft/compute_seconds": 300.0}},
      "stage_time_s": {"sft": 0.1}})  # A rerun that reused the stage.
  run = tmp_path / "seed0" / "grpo"
  os.makedirs(run)
  with open(run / "metrics.jsonl", "w") as f:
    for step, (wrong, zero, secs, right, unfaithful) in enumerate(
        [(0.6, 0.7, 3.0, 0.1, 0.1), (0.4, 0.5, 2.0, 0.2, 0.1),
         (0.2, 0.3, 2.5, 0.5, 0.1)], start=1):
      f.write(json.dumps({"stage": "rl", "step": step,
                          "train/all_wrong_groups": wrong,
                          "train/zero_outcome_signal_groups": zero,
                          "train/reward_mean": right,
                          "train/correct_with_wrong_step": unfaithful,
                          "time/step_s": secs}) + "\n")
  rows = reports.regime_statistics(str(tmp_path), 2, "grpo")
  # Of the 0.1 + 0.2 + 0.5 right answers, 0.3 had a wrong step.
  assert rows == [{"seed": 0, "start_accuracy": 0.21, "sft_steps": 900,
                   "sft_seconds": 300.0, "all_wrong_first": 0.6,
                   "all_wrong_mean": pytest.approx(0.4),
                   "zero_signal_mean": pytest.approx(0.5),
                   "rl_step_seconds": 2.5,
                   "right_wrong_step_first": pytest.approx(1.0),
                   "right_wrong_step_mean": pytest.approx(0.375)}]
  assert ("| 0 | 0.210 (900, 300) | 0.60 / 0.40 | 0.50 | 1.00 / 0.38 | "
          "2.50 |") in reports.regime_table(rows, "grpo")


def test_verifier_statistics_average_each_verifier_over_its_seeds(tmp_path):
  def write(seed, name, stages):
    os.makedirs(tmp_path / f"seed{seed}" / name)
    metrics_lib.write_summary(str(tmp_path / f"seed{seed}" / name),
                              {"stages": stages, "stage_time_s": {}})
  for seed, (q, auroc, f1) in enumerate([(0.8, 0.6, 0.5), (0.9, 0.7, 0.3)]):
    write(seed, "labels", {"labels": {"labels/q_auroc_vs_oracle": q}})
    write(seed, "prm_step", {"prm": {
        "prm/model": "generative", "prm/target": "progress",
        "prm/label_problems": 256, "prm/valid_auroc_vs_oracle": auroc,
        "prm/valid_f1_at_half": f1, "prm/valid_auroc_vs_labels": 0.9}})
  write(2, "prm_step", {"prm": {
      "prm/model": "generative", "prm/target": "progress",
      "prm/valid_auroc_vs_oracle": 0.8, "prm/valid_f1_at_half": float("nan"),
      "prm/valid_auroc_vs_labels": 0.9}})  # F1 not measured.
  rows = reports.verifier_statistics(str(tmp_path), 4,
                                     ["prm_step", "prm_soft"])
  assert [r["name"] for r in rows] == ["labels", "prm_step"]  # No prm_soft.
  labels, step = rows
  assert labels["mean"] == {"labels/q_auroc_vs_oracle": pytest.approx(0.85)}
  assert labels["per_seed"]["labels/q_auroc_vs_oracle"] == [0.8, 0.9, None,
                                                            None]
  assert step["per_seed"]["prm/valid_f1_at_half"] == [0.5, 0.3, None, None]
  assert step["mean"]["prm/valid_f1_at_half"] == pytest.approx(0.4)
  assert step["mean"]["prm/valid_auroc_vs_oracle"] == pytest.approx(0.7)
  assert (step["model"], step["target"]) == ("generative", "progress")
  table = reports.verifier_table(rows)
  assert ("| labels (Q̂ itself) | Monte-Carlo rollouts | 0.85 (0.80, 0.90, "
          "–, –) | – | – |") in table
  assert ("| prm_step | generative, progress | 0.70 (0.60, 0.70, 0.80, –) | "
          "0.40 (0.50, 0.30, –, –) | 0.90 (0.90, 0.90, 0.90, –) |") in table
  assert compare.verifier_dirs(["grpo", "tp_grpo", "pav", "pure",
                                "sft_continue"]) == ["prm_soft", "prm_step"]


def test_diagnostics_average_every_step_of_every_seed(tmp_path):
  for seed, (blame, var) in enumerate([(1.0, 0.2), (0.5, 0.4)]):
    run = tmp_path / f"seed{seed}" / "oracle"
    os.makedirs(run)
    with open(run / "metrics.jsonl", "w") as f:
      for step in (1, 2):
        f.write(json.dumps({
            "stage": "rl", "step": step,
            "train/process_blames_first_error": blame,
            "train/advantage_var_process": var * step}) + "\n")
      f.write(json.dumps({"stage": "sft", "step": 3,
                          "train/advantage_var_process": 99.0}) + "\n")
  means = reports.diagnostics(str(tmp_path), ["oracle", "grpo"], 2)
  assert means == {"oracle": {
      "train/process_blames_first_error": pytest.approx(0.75),
      "train/advantage_var_process": pytest.approx(0.45)}}
  table = reports.diagnostics_table(means)
  assert "| oracle | – | – | – | 0.450 | 0.750 | – | – | – |" in table
