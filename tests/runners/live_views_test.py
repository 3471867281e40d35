"""Kill a run, resume it, and read its TensorBoard files back: each step once.

`experiments/train.py` runs the SFT stage (`configs/default.py:size=test`, 6
steps, a checkpoint every 3) in a subprocess that SIGKILLs itself right after
writing step 5's metrics: steps 4 and 5 reached metrics.jsonl, TensorBoard and
W&B (offline) but not a checkpoint. The rerun resumes from step 3 and runs
steps 4-6 again. TensorBoard's own reader must then see exactly 6 points per
per-step scalar, with the values the resumed run wrote, and W&B must have
resumed the same run.
"""

import glob
import importlib.util
import os
import subprocess
import sys

import jax
import pytest
from tensorboard.backend.event_processing import event_accumulator

from rl_rewards import event_files
from rl_rewards import metrics as metrics_lib
from rl_rewards import wandb_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "runners", "live_views_worker.py")
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def read_scalars(workdir) -> dict:
  """{tag: [(step, value), ...]} as TensorBoard reads `<workdir>/tensorboard`."""
  reader = event_accumulator.EventAccumulator(
      os.path.join(workdir, event_files.DIRNAME),
      size_guidance={event_accumulator.SCALARS: 0})
  reader.Reload()
  return {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
          for tag in reader.Tags()["scalars"]}


def _env(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_SILENT="true",
             WANDB_MODE="offline")
  # One CPU device (the test session's fake 8 are not needed here).
  env["XLA_FLAGS"] = " ".join(
      f for f in env.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count"))
  cache_dir = jax.config.jax_compilation_cache_dir
  if cache_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
               "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    path = tmp_path / name.lower()
    path.mkdir(exist_ok=True)
    env[name] = str(path)
  env.pop("WANDB_API_KEY", None)
  return env


def _train(kill_at, workdir, env, with_wandb):
  flags = ["--config=configs/default.py:size=test", f"--workdir={workdir}",
           "--config.stages=sft", "--config.sft.max_steps=6",
           "--config.sft.checkpoint_every_steps=3",
           "--config.sft.gate_every_steps=1000"]
  if with_wandb:
    flags += ["--config.logging.wandb_project=rl-rewards-test",
              "--config.logging.wandb_mode=offline"]
  return subprocess.run([sys.executable, WORKER, kill_at] + flags, cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=480)


# With W&B too (offline) under `-m slow`: its background service makes the
# run slower and more timing-dependent.
@pytest.mark.parametrize("with_wandb", [
    False, pytest.param(True, marks=[
        pytest.mark.slow,
        pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed")])])
def test_kill_and_resume_shows_each_step_once(tmp_path, with_wandb):
  workdir = str(tmp_path / "run")
  env = _env(tmp_path)
  killed = _train("sft:5", workdir, env, with_wandb)
  assert killed.returncode == -9, killed.stdout + killed.stderr
  before = read_scalars(workdir)
  assert [s for s, _ in before["sft/train/loss"]] == [1, 2, 3, 4, 5]
  stale = dict(before["sft/time/compute_s"])

  resumed = _train("-", workdir, env, with_wandb)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert "[sft] resuming from step 3" in resumed.stdout

  scalars = read_scalars(workdir)
  per_step = [t for t in scalars
              if t.startswith(("sft/train/", "sft/perf/", "sft/time/"))]
  assert len(per_step) >= 5, sorted(scalars)
  for tag in per_step:
    assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4, 5, 6], tag
  # Each point is the one the resumed run wrote (its compute time differs
  # from the killed attempt's at steps 4 and 5).
  records = [r for r in metrics_lib.read_metrics(workdir)
             if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  for record in records:
    for tag in per_step:
      key = tag[len("sft/"):]
      got = dict(scalars[tag])[record["step"]]
      assert got == pytest.approx(record[key], rel=1e-6), (tag, record)
  assert dict(scalars["sft/time/compute_s"])[4] != stale[4]
  assert [s for s, _ in scalars["sft/eval/accuracy"]] == [6]
  assert len(event_files.event_files(os.path.join(workdir, "tensorboard"))) == 1

  if with_wandb:
    run_id = metrics_lib.read_json(
        os.path.join(workdir, wandb_run.STATE_FILE))["run_id"]
    runs = glob.glob(os.path.join(env["WANDB_DIR"], "wandb", "offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(f"-{run_id}") for r in runs)
