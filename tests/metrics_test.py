"""The metrics writer: its TensorBoard mirror, read back with TensorBoard's
own reader (`EventAccumulator`), and metrics.jsonl under kills (torn lines,
record counts, truncation)."""

import json
import math
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator

from rl_rewards import event_files
from rl_rewards import kill_points
from rl_rewards import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ["sft", "labels", "rl"]
LOGGING = {"tensorboard": True}


def read_scalars(workdir) -> dict:
  """{tag: [(step, value), ...]} as TensorBoard reads `<workdir>/tensorboard`."""
  reader = event_accumulator.EventAccumulator(
      os.path.join(workdir, event_files.DIRNAME),
      size_guidance={event_accumulator.SCALARS: 0})
  reader.Reload()
  return {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
          for tag in reader.Tags()["scalars"]}


def _writer(workdir, **kwargs):
  return metrics_lib.MetricsWriter(str(workdir), logging=LOGGING,
                                   stage_order=STAGES, **kwargs)


def test_every_numeric_metric_is_a_tagged_scalar_at_its_step(tmp_path):
  writer = _writer(tmp_path)
  for step in (1, 2, 3):
    writer.write("sft", step, {"train/loss": 1.0 / step, "samples": step * 8,
                               "flag": True, "labels/path": "/x",
                               "eval/list": [1, 2]})
  writer.write("rl", 0, {"eval/accuracy": float("nan")})
  writer.close()
  scalars = read_scalars(tmp_path)
  assert set(scalars) == {"sft/train/loss", "sft/samples", "rl/eval/accuracy"}
  assert [s for s, _ in scalars["sft/train/loss"]] == [1, 2, 3]
  assert scalars["sft/samples"] == [(1, 8.0), (2, 16.0), (3, 24.0)]
  assert math.isnan(scalars["rl/eval/accuracy"][0][1])
  assert len(event_files.event_files(tmp_path / "tensorboard")) == 1


def test_resume_rewrites_the_event_files_without_the_dropped_steps(tmp_path):
  writer = _writer(tmp_path)
  for step in range(1, 6):  # Steps 4 and 5 come after the last checkpoint.
    writer.write("sft", step, {"train/loss": float(step)})
  writer.write("labels", 1, {"labels/q_mean": 0.5})
  # Killed: no close(). The restart resumes sft from its step-3 checkpoint.
  resumed = _writer(tmp_path)
  resumed.drop_after(STAGES, "sft", 3)
  for step in range(4, 7):
    resumed.write("sft", step, {"train/loss": 10.0 * step})
  resumed.close()
  scalars = read_scalars(tmp_path)
  assert scalars == {"sft/train/loss": [(1, 1.0), (2, 2.0), (3, 3.0),
                                        (4, 40.0), (5, 50.0), (6, 60.0)]}
  assert len(event_files.event_files(tmp_path / "tensorboard")) == 1
  steps = [(r["stage"], r["step"]) for r in metrics_lib.read_metrics(tmp_path)]
  assert steps == [("sft", s) for s in range(1, 7)]


def test_a_stage_that_starts_over_drops_its_earlier_attempt(tmp_path):
  # An attempt killed before the stage's first checkpoint: its records must
  # not stay next to the ones the restarted stage writes.
  writer = _writer(tmp_path)
  writer.write("sft", 1, {"train/loss": 1.0})
  writer.write("rl", 0, {"eval/accuracy": 0.1})
  writer.write("rl", 1, {"train/reward_mean": 0.2})
  restarted = _writer(tmp_path)  # sft was reused (no writes); rl starts over.
  restarted.write("rl", 0, {"eval/accuracy": 0.25})
  restarted.close()
  records = metrics_lib.read_metrics(tmp_path)
  assert [(r["stage"], r["step"]) for r in records] == [("sft", 1), ("rl", 0)]
  assert read_scalars(tmp_path) == {"sft/train/loss": [(1, 1.0)],
                                    "rl/eval/accuracy": [(0, 0.25)]}


def test_events_lost_in_a_kill_are_restored_from_the_metrics_file(tmp_path):
  writer = _writer(tmp_path)
  for step in (1, 2):
    writer.write("sft", step, {"train/loss": float(step)})
  writer.close()
  for path in event_files.event_files(tmp_path / "tensorboard"):
    os.remove(path)  # As if the kill came before the writer flushed.
  resumed = _writer(tmp_path)
  resumed.drop_after(STAGES, "sft", 2)
  resumed.write("sft", 3, {"train/loss": 3.0})
  resumed.close()
  assert read_scalars(tmp_path) == {
      "sft/train/loss": [(1, 1.0), (2, 2.0), (3, 3.0)]}


def test_a_metric_repeated_at_a_step_keeps_its_first_point(tmp_path):
  writer = _writer(tmp_path)
  writer.write("labels", 2, {"labels/q_mean": 0.25, "time/shard_s": 3.0})
  # The stage's summary repeats the statistics at its last step.
  writer.write("labels", 2, {"labels/q_mean": 0.5, "labels/solutions": 16})
  writer.close()
  scalars = read_scalars(tmp_path)
  assert scalars["labels/labels/q_mean"] == [(2, 0.25)]
  assert scalars["labels/labels/solutions"] == [(2, 16.0)]
  assert len(metrics_lib.read_metrics(tmp_path)) == 2  # The file keeps both.


def test_no_event_files_without_writes_or_when_off(tmp_path):
  os.makedirs(tmp_path / "a")
  reader_only = _writer(tmp_path / "a")  # e.g. the notebook's read-only ctx.
  reader_only.close()
  assert not os.path.exists(tmp_path / "a" / "tensorboard")
  off = metrics_lib.MetricsWriter(str(tmp_path), logging={"tensorboard": False},
                                  stage_order=STAGES)
  off.write("sft", 1, {"train/loss": 1.0})
  off.close()
  assert not os.path.exists(tmp_path / "tensorboard")
  assert len(metrics_lib.read_metrics(tmp_path)) == 1


def test_wandb_is_imported_only_when_a_project_is_set(tmp_path):
  code = (
      "import sys\n"
      "from rl_rewards import metrics\n"
      f"w = metrics.MetricsWriter({str(tmp_path)!r}, "
      "logging={'tensorboard': True, 'wandb_project': ''})\n"
      "w.write('sft', 1, {'train/loss': 1.0}); w.close()\n"
      "print('wandb' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, cwd=ROOT,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.stdout.strip().splitlines()[-1] == "False"
  assert json.loads(open(tmp_path / "metrics.jsonl").readline())["step"] == 1


class _Killed(BaseException):
  pass


@pytest.fixture
def kill_at(monkeypatch):
  """Arms a kill point; the kill raises `_Killed` instead of SIGKILL."""

  def arm(spec):
    monkeypatch.setenv(kill_points.KILL_ENV, spec)
    kill_points.reset()

  def killed():
    raise _Killed()

  monkeypatch.setattr(kill_points, "kill_now", killed)
  yield arm
  monkeypatch.delenv(kill_points.KILL_ENV, raising=False)
  kill_points.reset()


def test_a_torn_record_is_cut_before_the_next_append(tmp_path, kill_at):
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  writer.write("sft", 1, {"train/loss": 1.0})
  kill_at("metrics.write:1")
  with pytest.raises(_Killed):
    writer.write("sft", 2, {"train/loss": 2.0})
  text = (tmp_path / "metrics.jsonl").read_text()
  assert not text.endswith("\n")  # Half a record, as a kill leaves it.
  kill_at("")
  again = metrics_lib.MetricsWriter(str(tmp_path))
  assert again.num_records == 1
  again.write("sft", 2, {"train/loss": 2.0})
  again.close()
  records = metrics_lib.read_metrics(str(tmp_path))
  assert [(r["step"], r["train/loss"]) for r in records] == [(1, 1.0),
                                                             (2, 2.0)]
  for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
    json.loads(line)  # No merged or broken line.


def test_truncate_keeps_a_prefix_and_counts(tmp_path):
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write("sft", step, {"x": step})
  assert writer.num_records == 5
  writer.truncate(3)
  assert writer.num_records == 3
  writer.write("sft", 4, {"x": 40})
  writer.truncate(10)  # More than it holds: nothing to drop.
  writer.close()
  assert [r["x"] for r in metrics_lib.read_metrics(str(tmp_path))] == [
      1, 2, 3, 40]


def test_drop_after_keeps_the_count(tmp_path):
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  for stage, step in (("sft", 1), ("sft", 2), ("rl", 1)):
    writer.write(stage, step, {})
  writer.drop_after(["sft", "rl"], "sft", 1)
  assert writer.num_records == 1
  writer.close()
  assert metrics_lib.MetricsWriter(str(tmp_path)).num_records == 1
