"""The kill-anywhere benchmark: its comparison, and a few real SIGKILLs."""

import json
import os
import random

import pytest

from experiments.benchmarks import faults
from experiments.benchmarks import results


def _workdir(path, loss=1.0, seconds=3.0):
  os.makedirs(path / "labels")
  records = [{"stage": "sft", "step": 1, "time": seconds, "train/loss": loss,
              "perf/tokens_per_sec": 1 / seconds, "time/compute_s": seconds},
             {"stage": "labels", "step": 1, "labels/path": str(path)}]
  (path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in records))
  (path / "summary.json").write_text(json.dumps({
      "stages": {"sft": {"eval/accuracy": 0.5, "sft/compute_seconds": seconds},
                 "labels": {"labels/path": str(path)}},
      "wall_time_s": seconds, "stage_time_s": {"sft": seconds}}))
  (path / "labels" / "shard-00000.jsonl").write_text("{}\n")
  return str(path)


def test_compare_ignores_only_times_and_paths(tmp_path):
  reference = _workdir(tmp_path / "a")
  assert faults.compare(reference, _workdir(tmp_path / "b", seconds=9.0)) == []
  diffs = faults.compare(reference, _workdir(tmp_path / "c", loss=1.5))
  assert diffs == [
      "metrics.jsonl differs: 2 records vs 2, first difference at record 0"]
  other = _workdir(tmp_path / "d")
  (tmp_path / "d" / "labels" / "shard-00000.jsonl").write_text("{ }\n")
  assert faults.compare(reference, other) == [
      "label files differ: shard-00000.jsonl"]
  with open(os.path.join(other, "metrics.jsonl"), "a") as f:
    f.write('{"stage": "rl", "step": 0}\n')
  assert "3 records vs 2" in faults.compare(reference, other)[0]


def test_inspect_kill_names_the_stage_and_partial_writes(tmp_path):
  workdir = _workdir(tmp_path / "w")
  os.makedirs(tmp_path / "w" / "checkpoints" / "sft" / "2")
  (tmp_path / "w" / "checkpoints" / "sft" / "stage_done.json").write_text("{}")
  os.makedirs(tmp_path / "w" / "checkpoints" / "prm" /
              "4.orbax-checkpoint-tmp-17")
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"stage": "la')
  (tmp_path / "w" / "run.lock").write_text('{"pid": 1}')
  assert faults.inspect_kill(workdir) == {
      "stage": "labels", "partial_checkpoint": True, "partial_shard": False,
      "torn_metrics_line": True, "lock_held": True}


def test_kill_plans_cover_points_and_stage_windows():
  reference = {"points": {"checkpoint.save": 6, "labels.shard": 2},
               "windows": {"prm": (10.0, 20.0)}, "seconds": 40.0}
  rng = random.Random(0)
  drawn, inside_save = set(), 0
  for _ in range(40):
    plan = faults.plan_kill(rng, "point", reference)
    name, n, *delay = plan["kill_at"].split(":")
    assert name in reference["points"]
    assert 1 <= int(n) <= reference["points"][name]
    drawn.add((name, int(n)))
    if delay:  # A delay only ever lands inside a checkpoint save.
      assert name == "checkpoint.save" and 0.0 <= float(delay[0]) <= 0.3
      inside_save += 1
    plan = faults.plan_kill(rng, "timer", reference, "prm")
    assert 0.0 <= plan["fraction"] <= 1.0 and plan["target"] == "prm"
  # Every occurrence of every kill point is drawn, some inside orbax's write.
  assert drawn == {("checkpoint.save", n) for n in range(1, 7)} | {
      ("labels.shard", 1), ("labels.shard", 2)}
  assert inside_save > 0
  # Restart kills land between 1 s and 80 % of the reference run (32 s),
  # spread over that window rather than bunched at one end.
  after = [faults.plan_kill(rng, "timer", reference, restart=True)
           ["kill_after"] for _ in range(200)]
  assert min(after) >= 1.0 and max(after) <= 32.0
  assert min(after) < 4.0 and max(after) > 29.0


def test_stage_timer_waits_for_the_stage(tmp_path):
  windows = {"sft": (0.0, 10.0), "labels": (10.0, 14.0)}
  sft = faults.stage_timer(str(tmp_path), "sft", 0.5, windows)
  assert not sft(4.9) and sft(5.0)
  labels = faults.stage_timer(str(tmp_path), "labels", 0.5, windows)
  assert not labels(30.0)  # sft has not finished.
  os.makedirs(tmp_path / "checkpoints" / "sft")
  (tmp_path / "checkpoints" / "sft" / "stage_done.json").write_text("{}")
  # Reached at 5 s instead of 10 s: twice as fast, so 0.5 * 4 s / 2 later.
  assert not labels(5.0) and not labels(5.9) and labels(6.0)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_sigkill_at_named_points_resumes_exactly(tmp_path, async_save):
  out = str(tmp_path)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=os.path.join(out, "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  config = "configs/default.py:size=test"
  extra = ["--config.checkpoint.async_save=true"] if async_save else []
  reference = faults.reference_runs(config, out, env, extra)
  assert reference["points"]["checkpoint.save"] >= 4
  # Inside a label shard's write, then inside an RL checkpoint's write.
  reference["points"] = {"labels.shard": 1}
  trial = faults.run_trial(0, random.Random(0), config, out, env, reference,
                           first_kind="point", target_stage=None, max_kills=1,
                           again=0.0, extra=extra)
  assert trial["exact"], trial["diffs"]
  assert trial["kills"][0]["partial_shard"]
  reference["points"] = {"checkpoint.save": 1}
  trial = faults.run_trial(1, random.Random(3), config, out, env, reference,
                           first_kind="point", target_stage=None, max_kills=1,
                           again=0.0, extra=extra)
  assert trial["exact"], trial["diffs"]
  assert trial["locks_taken_over"] == 1


def _kill(stage, *, checkpoint=False, shard=False, torn=False):
  return {"stage": stage, "partial_checkpoint": checkpoint,
          "partial_shard": shard, "torn_metrics_line": torn}


def test_summary_counts_kills_per_stage_and_renders_the_tables():
  # Trial 0: two kills (sft, then rl), exact; trial 1: one labels kill that
  # left a partial shard, not exact; trial 2: one sft kill with a torn line.
  result = {"config": "configs/default.py:size=test", "async_save": False,
            "reference_seconds": 50.0, "seconds": 600.0, "trials": [
                {"exact": True, "kills": [_kill("sft", checkpoint=True),
                                          _kill("rl")]},
                {"exact": False, "kills": [_kill("labels", shard=True)]},
                {"exact": True, "kills": [_kill("sft", torn=True)]}]}
  s = faults.summary(result)
  assert s["runs"] == [{"run": "synchronous checkpoints, "
                               "configs/default.py:size=test", "kills": 4,
                        "trials": 3, "exact_trials": 2, "exact_kills": 3}]
  assert s["by_stage"] == [
      {"stage": "sft", "kills": 2, "partial_checkpoint": 1, "partial_shard": 0,
       "torn_metrics": 1, "exact_trials": 2, "trials": 2},
      {"stage": "labels", "kills": 1, "partial_checkpoint": 0,
       "partial_shard": 1, "torn_metrics": 0, "exact_trials": 0, "trials": 1},
      {"stage": "rl", "kills": 1, "partial_checkpoint": 0, "partial_shard": 0,
       "torn_metrics": 0, "exact_trials": 1, "trials": 1}]
  data = dict(s, provenance={
      "revision": "0123456789", "uncommitted_changes": False,
      "date": "2026-11-27T00:00:00+00:00",
      "machine": {"cpu": "cpu", "cores": 2, "python": "3.11"},
      "load_average_start": [1.0], "load_average_end": [2.0]})
  blocks = results.render("faults", data)
  assert "| 4 | 3 | 2/3 trials (3/4 kills) |" in blocks[0]
  assert "| labels | 1 | 0 | 1 | 0 | 0/1 |" in blocks[1]
