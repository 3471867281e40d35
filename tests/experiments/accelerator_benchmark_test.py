"""experiments/benchmarks/accelerator.py: its arithmetic, and its sections
run at toy sizes on CPU (`--dry_run`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.benchmarks import accelerator
from experiments.benchmarks import accelerator_sections as accel_sections

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_relative_error_counts_only_masked_positions():
  ref = np.array([[[3.0, 4.0], [100.0, 0.0]]])   # [B=1, T=2, V=2]
  out = np.array([[[3.0, 4.5], [0.0, 0.0]]])
  mask = np.array([[1, 0]])
  # Only position 0: |(0, 0.5)| / |(3, 4)| = 0.5 / 5.
  assert accel_sections.relative_error(out, ref, mask) == pytest.approx(0.1)
  assert accel_sections.relative_error(ref, ref, np.ones((1, 2))) == 0.0


def test_agreement_prefix_is_the_earliest_divergence():
  a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  b = np.array([[1, 2, 3, 9], [5, 0, 7, 8]])
  assert accel_sections.agreement_prefix(a, b) == 1
  assert accel_sections.agreement_prefix(a, a) == 4


def test_decode_bytes_by_hand():
  cfg = accel_sections.hf_model_config(None)  # L=2, KVH=2, Dh=16.
  per_token = 2 * 2 * 2 * 16 * 2           # L · (k, v) · KVH · Dh · bf16
  mask = np.array([[0, 1, 1], [1, 1, 1]])  # 2 and 3 real prompt tokens.
  moved = accel_sections.decode_bytes(cfg, mask, new_tokens=2, weight_bytes=100)
  # Steps 0 and 1 read (2 + 0) + (2 + 1) and (3 + 0) + (3 + 1) tokens.
  assert moved["kv_bytes"] == (2 + 3 + 3 + 4) * per_token
  assert moved["weight_bytes"] == 200
  assert moved["total_bytes"] == 200 + 12 * per_token


def test_attention_targets_from_hlo_text():
  text = ('%a = custom-call(), custom_call_target="__cudnn$fmhaScaleBias'
          'Softmax"\n%b = custom-call(), custom_call_target="__cublas$gemm"')
  assert accel_sections._attention_targets(text) == [
      "__cudnn$fmhaScaleBiasSoftmax"]


def test_sample_batches_replace_the_sampling_sizes_only():
  chosen = accel_sections.sizes(False, (32,))
  assert chosen["sample_batches"] == (32,)
  assert accel_sections.sizes(False)["sample_batches"] == (64, 256)
  assert {k: v for k, v in chosen.items() if k != "sample_batches"} == {
      k: v for k, v in accel_sections.REAL.items() if k != "sample_batches"}


def test_left_padded_prompts():
  tokens, mask = accel_sections.left_padded_prompts(16, 12, 50, seed=0)
  assert tokens.shape == mask.shape == (16, 12)
  assert (mask[:, -1] == 1).all()                     # Real tokens last,
  assert (np.diff(mask, axis=1) >= 0).all()           # padding first,
  assert ((tokens == 0) == (mask == 0)).all()         # and only there.
  assert (mask.sum(1) >= 9).all()                     # At most P/4 pads.


def test_model_and_step_code_import_without_task_libraries():
  # The accelerator machine has jax, flax, optax, orbax, torch and
  # transformers but not the task libraries: the model, sampler and step
  # code (what the accelerator sections import) must not need them.
  blocked = ["tensorflow_datasets", "grain", "array_record", "reasoning_gym",
             "math_verify", "wandb"]
  script = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name.split(".")[0] in {blocked!r}:
      raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
import experiments.benchmarks.accelerator
import experiments.benchmarks.train_step
import rl_rewards.models, rl_rewards.rollout.sampler, rl_rewards.train.steps
import rl_rewards.runners.context, rl_rewards.runners.programs
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=_ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]


def _dry_run(tmp_path, sections, flags=()):
  out = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.accelerator",
       "--dry_run", f"--out_dir={out}", f"--sections={','.join(sections)}",
       "--budget_s=600", *flags],
      cwd=_ROOT, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out / "accelerator.json", encoding="utf-8") as f:
    data = json.load(f)
  assert (out / "accelerator.log").exists()
  return data, result.stdout


def test_dry_run_probe_and_correctness(tmp_path):
  data, stdout = _dry_run(tmp_path, ["probe", "correctness"])
  probe = data["sections"]["probe"]
  assert probe["status"] == "ok", probe
  assert probe["results"]["matmul_tflops"] > 0
  assert probe["results"]["copy_gb_s"] > 0
  check = data["sections"]["correctness"]
  assert check["status"] == "ok", check
  results = check["results"]
  # On CPU both sides run the same float32 program.
  assert results["logits_rel_err_f32"] < accel_sections.F32_TOLERANCE
  assert 0 < results["logits_rel_err_bf16"] < accel_sections.BF16_TOLERANCE
  assert results["greedy_f32_identical"] is True
  assert results["attention_implementation"] == "xla"
  assert "| correctness | ok |" in stdout


def test_dry_run_sample_batches_reach_the_section(tmp_path):
  data, _ = _dry_run(tmp_path, ["probe", "sample_cublas"],
                     ["--sample_batches=3"])
  assert data["sizes"]["sample_batches"] == [3]
  section = data["sections"]["sample_cublas"]
  assert section["status"] == "ok", section
  assert [r["batch"] for r in section["results"]["rows"]] == [3]


@pytest.mark.slow
def test_dry_run_every_section(tmp_path):
  data, _ = _dry_run(tmp_path, list(accelerator.SECTIONS))
  sections = data["sections"]
  for name in accelerator.SECTIONS:
    status = sections[name]["status"]
    if name in ("train_torch", "sample_hf") and status == "skipped":
      continue  # No torch here.
    assert status == "ok", (name, sections[name])
  if sections["train_torch"]["status"] == "ok":
    # Each step kind starts from the checkpoint on both sides.
    for row in sections["train_torch"]["results"]["rows"]:
      for remat in ("none", "full"):
        assert row[f"first_loss_rel_diff_remat_{remat}"] < 3e-2, row
  assert sections["sample_cublas"]["results"]["xla_flags"].endswith(
      "--xla_gpu_enable_triton_gemm=false")
  train = sections["train"]["results"]["rows"]
  assert {(r["step"], r["remat"]) for r in train} == {
      (k, r) for k in ("sft", "policy") for r in ("none", "full")}
  assert all(r["losses_finite"] and r["tokens_per_s"] > 0 for r in train)
  sample = sections["sample"]["results"]["rows"]
  assert [r["batch"] for r in sample] == list(accel_sections.DRY[
      "sample_batches"])
  assert all(0 < r["mbu"] for r in sample)
  rl = sections["rl_step"]["results"]
  assert rl["rl_steps_recorded"] >= 2
  step = rl["step_2"]
  phases = sum(step[name] for name in ("rollout", "reward", "reference",
                                        "advantages", "update"))
  assert phases == pytest.approx(step["step_s"], rel=0.05, abs=0.02)
  assert step["losses_finite"] is True and "train/loss" in step
  assert step["train/skipped_updates"] == 0
  job = sections["default_job"]["results"]
  assert job["finished"] is True and job["wall_s"] > 0
