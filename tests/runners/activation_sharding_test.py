"""Every jitted program of a run splits its activations over the batch axes.

Each program of the pipeline (SFT, PRM, policy, value and implicit-PRM
updates, the sampler, the verifier's scorer, the reference-log-prob and value
passes) is compiled as the stages compile it (`runners.programs`), for 8 fake
CPU devices with `fsdp=8`, and its partitioned HLO is searched for an array
that holds the whole global batch next to the sequence axis on one device.
The model is wide enough (D = 256) that XLA, left to itself, shards the
hidden dimension instead of the batch: the first test shows the check catches
that when the logical-axis rules are not active.
"""

import os

import jax
import pytest

from rl_rewards import cli
from rl_rewards import models
from rl_rewards.runners import plan
from rl_rewards.runners import programs
from rl_rewards.sharding import inspection
from rl_rewards.sharding import mesh as mesh_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# Global rows and sequence length, unlike any model dimension below.
ROWS, PROMPT, NEW = 48, 16, 24
LENGTH = PROMPT + NEW
MODEL = models.ModelConfig(
    vocab_size=512, hidden_size=256, num_layers=1, num_heads=4,
    num_kv_heads=2, head_dim=64, intermediate_size=1024,
    max_position_embeddings=128)


def _config(name):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", f"{name}.py") + ":size=test")
  config.task.max_prompt_len = PROMPT
  config.task.max_new_tokens = NEW
  config.sft.batch_size = ROWS
  config.prm.batch_size = ROWS
  config.rl.prompts_per_step = 8
  config.rl.group_size = ROWS // 8
  config.rl.minibatches = 1
  return config


def _mesh():
  return mesh_lib.make_mesh(dict(data=1, fsdp=8, tensor=1))


def _builders(name, mesh):
  return {b.name: b for b in plan.pipeline_programs(_config(name), MODEL,
                                                    mesh)}


def _offenders(builder):
  compiled = builder.build(ROWS).lower().compile()
  return inspection.global_batch_arrays(compiled.as_text(), ROWS, LENGTH)


def test_check_catches_whole_batch_activations_without_rules():
  mesh = _mesh()
  builder = _builders("grpo", mesh)["sft/update"]
  assert _offenders(builder), (
      "without the rules the compiler should keep the batch whole somewhere; "
      "if it no longer does, this test's model must be made wider")


PROGRAMS = [
    ("pav", "sft/update"),
    ("pav", "prm/update"),
    ("pav", "rl/rollout"),
    ("pav", "rl/prm_scores"),
    ("pav", "rl/policy_update"),
    ("ppo", "rl/values"),
    ("ppo", "rl/value_update"),
    ("prime", "rl/reference_logprobs"),
    ("prime", "rl/implicit_prm_logprobs"),
    ("prime", "rl/implicit_prm_update"),
]


@pytest.mark.parametrize("name,program", PROGRAMS)
def test_program_splits_the_batch(name, program):
  mesh = _mesh()
  with mesh_lib.activate(mesh):
    builders = _builders(name, mesh)
    assert program in builders, sorted(builders)
    offenders = _offenders(builders[program])
  assert not offenders, f"{program} holds the global batch: {offenders[:5]}"


def test_every_program_of_the_methods_is_covered():
  mesh = _mesh()
  names = set()
  for name in ("pav", "ppo", "prime"):
    names |= set(_builders(name, mesh))
  assert names == {program for _, program in PROGRAMS}


def test_inspection_reads_per_device_shapes():
  text = ("%a = f32[48,40,256]{2,1,0} parameter(0)\n"
          "%b = f32[6,40,256]{2,1,0} add(%x, %y)\n"
          "%c = s32[1920,1,32]{2,1,0} gather(%t, %i)\n"
          "ROOT %d = (f32[6,39]{1,0}, f32[]) tuple(%p, %q)\n")
  assert inspection.global_batch_arrays(text, 48, 40) == [
      "%a: f32[48,40,256]", "%c: s32[1920,1,32]"]
  assert jax.device_count() == 8


def test_sampler_weights_copy_is_cast_and_gathered_over_fsdp():
  mesh = _mesh()
  config = _config("grpo")
  config.rl.sampler_dtype = "bfloat16"
  config.rl.sampler_gather_fsdp = True
  cfg = models.preset("test", 64)
  params = models.init_params(cfg, jax.random.key(0))
  with mesh_lib.activate(mesh):
    placed = jax.device_put(params, mesh_lib.logical_to_shardings(
        models.param_logical_axes(cfg), mesh))
    copy = programs.sampler_weights(config, cfg, mesh)(placed)
  for leaf, original in zip(jax.tree.leaves(copy), jax.tree.leaves(placed)):
    assert leaf.dtype == jax.numpy.bfloat16
    assert "fsdp" not in str(leaf.sharding.spec)
    assert (leaf.astype("float32") ==
            original.astype("bfloat16").astype("float32")).all()
  # Training layout: the embedding dimension is split over fsdp.
  assert any("fsdp" in str(l.sharding.spec) for l in jax.tree.leaves(placed))
