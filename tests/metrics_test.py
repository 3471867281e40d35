"""metrics.jsonl survives kills: torn lines, record counts, truncation."""

import json

import pytest

from rl_rewards import kill_points
from rl_rewards import metrics as metrics_lib


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
