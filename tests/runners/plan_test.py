"""The memory planner: its numbers are those of the stages' real programs."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import models
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import plan
from rl_rewards.runners import programs
from rl_rewards.sharding import mesh as mesh_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _config():
  return cli.load_config_file(
      os.path.join(ROOT, "configs", "grpo.py") + ":size=test")


def _memory(compiled):
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes, m.output_size_in_bytes,
          m.alias_size_in_bytes, m.temp_size_in_bytes)


def test_plan_equals_the_stage_program_on_real_arrays():
  config = _config()
  model_config = models.preset("test", 24)
  mesh = mesh_lib.make_mesh(dict(data=2, fsdp=4, tensor=1))
  with mesh_lib.activate(mesh):
    builder = {b.name: b for b in plan.pipeline_programs(
        config, model_config, mesh)}["sft/update"]
    rows = builder.rows
    report = plan.measure(builder.build(rows))
    planned = _memory(builder.build(rows).lower().compile())

    # The SFT stage's own construction, on concrete parameters and a batch.
    tx = programs.sft_optimizer(config.sft)
    params = models.init_params(model_config, jax.random.key(0))
    state, shardings = context_lib.create_state(model_config, mesh, params,
                                                tx)
    step = programs.jit_update(
        programs.sft_step_fn(config, model_config, tx), shardings, mesh)
    length = config.task.max_prompt_len + config.task.max_new_tokens
    batch = mesh_lib.put_batch(
        {k: np.ones((rows, length), np.int32)
         for k in ("tokens", "attention_mask", "loss_mask")}, mesh)
    real = _memory(step.lower(state, batch).compile())
  assert planned == real
  arguments, outputs, aliased, temps = real
  assert report.total == arguments + outputs - aliased + temps
  assert report.params == plan.per_device_bytes(state.params)
  assert report.optimizer == plan.per_device_bytes(state.opt_state)
  assert report.params > 0 and report.optimizer > 0 and report.activations > 0


def test_largest_rows_solves_the_affine_model():
  report = plan.ProgramMemory(
      name="x", rows=64, length=8, params=0, optimizer=0, inputs=0,
      activations=0, kv_cache=0, total=1000 + 64 * 10, resident=200,
      compile_s=0.0, bytes_per_row=10.0)
  assert report.peak == 1840
  # 1200 fixed bytes + 10 per row: 3000 bytes hold 180 rows, 176 in 16s.
  assert report.largest_rows(3000, unit=16) == 176
  assert report.largest_rows(1000, unit=16) == 0


def test_check_fits_names_every_program_that_does_not_fit():
  small = plan.ProgramMemory("rl/rollout", 8, 8, 0, 0, 0, 0, 0,
                             total=2**30, resident=0, compile_s=0.0)
  big = plan.ProgramMemory("rl/policy_update", 8, 8, 0, 0, 0, 0, 0,
                           total=3 * 2**30, resident=2**30, compile_s=0.0)
  plan.check_fits([small, big], 4.5)
  with pytest.raises(ValueError, match=r"rl/policy_update needs 4\.00 GiB"):
    plan.check_fits([small, big], 3.5)


def test_cli_prints_the_table_and_fails_naming_the_step():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.plan",
       f"--config={os.path.join(ROOT, 'configs', 'grpo.py')}:size=test",
       "--devices=4", "--only=sft/update", "--device_memory_gb=0.000001",
       "--nolargest_batch"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 1, result.stderr[-2000:]
  assert "| sft/update | 16 x" in result.stdout
  assert "'fsdp': 1" in result.stdout and "(4 devices)" in result.stdout
  assert "does not fit" in result.stderr and "sft/update" in result.stderr
