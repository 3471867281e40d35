"""W&B logging: one run per workdir, resumed after a restart, each point once.

The first tests replace the `wandb` module with a recorder (what is sent, and
how the run is started); the last one runs the real client offline (no
network), with every W&B directory inside the test's tmp_path.
"""

import glob
import os
import re
import sys
import types

import pytest

from rl_rewards import metrics as metrics_lib
from rl_rewards import wandb_run

STAGES = ["sft", "rl"]


class _FakeRun:

  def __init__(self, calls):
    self.calls = calls

  def define_metric(self, name, step_metric=None):
    self.calls.append(("define_metric", name, step_metric))

  def log(self, data):
    self.calls.append(("log", dict(data)))

  def finish(self):
    self.calls.append(("finish",))


@pytest.fixture
def fake_wandb(monkeypatch):
  calls = []

  def init(**kwargs):
    calls.append(("init", kwargs))
    return _FakeRun(calls)

  monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
  monkeypatch.delenv("WANDB_DIR", raising=False)
  return calls


def _logging(**overrides):
  return dict({"tensorboard": False, "wandb_project": "proj",
               "wandb_entity": "", "wandb_mode": "offline"}, **overrides)


def _logged(calls, tag):
  return [(c[1][tag.split("/")[0] + "/step"], c[1][tag]) for c in calls
          if c[0] == "log" and tag in c[1]]


def test_points_go_against_the_stage_step(tmp_path, fake_wandb):
  writer = metrics_lib.MetricsWriter(str(tmp_path), logging=_logging(),
                                     stage_order=STAGES,
                                     run_config={"seed": 3})
  writer.write("sft", 1, {"train/loss": 2.0, "labels/path": "/x"})
  writer.write("rl", 0, {"eval/accuracy": 0.5})
  writer.close()
  (_, init), = [c for c in fake_wandb if c[0] == "init"]
  assert init["project"] == "proj" and init["mode"] == "offline"
  assert init["resume"] == "allow" and init["config"] == {"seed": 3}
  assert init["dir"] == str(tmp_path) and init["entity"] is None
  assert init["id"] == metrics_lib.read_json(
      tmp_path / wandb_run.STATE_FILE)["run_id"]
  assert ("define_metric", "sft/*", "sft/step") in fake_wandb
  assert ("define_metric", "rl/*", "rl/step") in fake_wandb
  assert _logged(fake_wandb, "sft/train/loss") == [(1, 2.0)]
  assert _logged(fake_wandb, "rl/eval/accuracy") == [(0, 0.5)]
  assert not any("sft/labels/path" in c[1] for c in fake_wandb
                 if c[0] == "log")
  assert fake_wandb[-1] == ("finish",)


def test_a_restart_resumes_the_run_and_sends_each_step_once(tmp_path,
                                                            fake_wandb):
  writer = metrics_lib.MetricsWriter(str(tmp_path), logging=_logging(),
                                     stage_order=STAGES)
  for step in range(1, 6):
    writer.write("sft", step, {"train/loss": float(step)})
  # Killed after step 5 (no close); the checkpoint is at step 3.
  resumed = metrics_lib.MetricsWriter(str(tmp_path), logging=_logging(),
                                      stage_order=STAGES)
  resumed.drop_after(STAGES, "sft", 3)
  for step in range(4, 7):
    resumed.write("sft", step, {"train/loss": float(step)})
  resumed.close()
  inits = [c[1] for c in fake_wandb if c[0] == "init"]
  assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"]
  # Steps 4 and 5 reached W&B before the kill; W&B cannot drop them, so
  # they are not sent again.
  assert [s for s, _ in _logged(fake_wandb, "sft/train/loss")] == [
      1, 2, 3, 4, 5, 6]


def test_enabling_wandb_on_resume_sends_the_history(tmp_path, fake_wandb):
  plain = metrics_lib.MetricsWriter(str(tmp_path), logging=_logging(
      wandb_project=""), stage_order=STAGES)
  plain.write("sft", 1, {"train/loss": 1.0})
  plain.close()
  assert not fake_wandb
  resumed = metrics_lib.MetricsWriter(str(tmp_path), logging=_logging(),
                                      stage_order=STAGES)
  resumed.drop_after(STAGES, "sft", 1)
  resumed.write("sft", 2, {"train/loss": 2.0})
  resumed.close()
  assert _logged(fake_wandb, "sft/train/loss") == [(1, 1.0), (2, 2.0)]


def test_offline_run_resumes_the_same_id(tmp_path, monkeypatch):
  wandb = pytest.importorskip("wandb")
  # W&B reads its directories from the environment once per process, at
  # its first setup: an earlier test's run would send these runs elsewhere.
  wandb.teardown()
  for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
               "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    path = tmp_path / name.lower()
    path.mkdir()
    monkeypatch.setenv(name, str(path))
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  workdir = tmp_path / "run"
  workdir.mkdir()
  logging = _logging(wandb_project="rl-rewards-test")
  first = metrics_lib.MetricsWriter(str(workdir), logging=logging,
                                    stage_order=STAGES)
  first.write("sft", 1, {"train/loss": 1.0})
  first.close()
  run_id = metrics_lib.read_json(workdir / wandb_run.STATE_FILE)["run_id"]
  second = metrics_lib.MetricsWriter(str(workdir), logging=logging,
                                     stage_order=STAGES)
  second.drop_after(STAGES, "sft", 1)
  second.write("sft", 2, {"train/loss": 2.0})
  second.close()
  state = metrics_lib.read_json(workdir / wandb_run.STATE_FILE)
  assert state["run_id"] == run_id
  assert state["last_step"]["sft/train/loss"] == 2
  runs = glob.glob(os.path.join(os.environ["WANDB_DIR"], "wandb",
                                "offline-run-*"))
  assert len(runs) == 2
  # Both directories carry the same run id. W&B names them by the second
  # they start in, and adds "-1" to the second one when both start within
  # the same second.
  pattern = rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?"
  assert all(re.fullmatch(pattern, os.path.basename(r)) for r in runs), runs
