"""Multi-turn episodes on a mesh: the planner's episode programs, and
`sample_episodes` sharded over 8 (fake CPU) devices."""

import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import models
from rl_rewards.envs import batched
from rl_rewards.models import model as model_lib
from rl_rewards.rollout import episodes
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import plan
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.tasks import hidden_operands as ho

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
EPISODE_PROGRAMS = ["rl/episode_prefill", "rl/episode_turn",
                    "rl/episode_repack", "rl/episode_observation"]


def _config(**model):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "multiturn.py") + ":size=test")
  for key, value in model.items():
    config.model[key] = value
  return config


def _cache_bytes(layers, rows, slots, kv_heads, head_dim, itemsize):
  """Keys and values of every layer: 2 L B S KVH Dh bytes."""
  return 2 * layers * rows * slots * kv_heads * head_dim * itemsize


def test_a_multi_turn_config_plans_the_episode_programs():
  config = _config()
  model_config, mesh, rules = pipeline.plan_context(config)
  with mesh_lib.activate(mesh, rules):
    builders = plan.pipeline_programs(config, model_config, mesh)
    single = plan.pipeline_programs(
        cli.load_config_file(os.path.join(ROOT, "configs", "grpo.py") +
                             ":size=test"), model_config, mesh)
  names = [b.name for b in builders]
  # The episode programs replace the single-turn sampler.
  assert "rl/rollout" not in names and "rl/rollout" in [b.name
                                                         for b in single]
  assert names[names.index("rl/episode_prefill"):][:4] == EPISODE_PROGRAMS
  by_name = {b.name: b for b in builders}
  rows = config.rl.prompts_per_step * config.rl.group_size
  params = plan.per_device_bytes(plan.abstract_params(model_config, mesh))
  for name in EPISODE_PROGRAMS:
    assert by_name[name].rows == rows
    assert by_name[name].unit == mesh.size * config.rl.group_size
  # The repack reads no parameters, so the policy it leaves alone counts
  # as resident; the other three read them.
  turn, repack = by_name["rl/episode_turn"], by_name["rl/episode_repack"]
  assert turn.resident == by_name["rl/episode_prefill"].resident
  assert repack.resident == turn.resident + params > params


def test_with_a_sampler_copy_the_episodes_read_the_copy():
  config = _config()
  config.rl.sampler_dtype = "bfloat16"
  model_config, mesh, rules = pipeline.plan_context(config)
  with mesh_lib.activate(mesh, rules):
    by_name = {b.name: b for b in plan.pipeline_programs(
        config, model_config, mesh)}
    turn = by_name["rl/episode_turn"].build(by_name["rl/episode_turn"].rows)
  params = plan.per_device_bytes(plan.abstract_params(model_config, mesh))
  copy = plan.per_device_bytes(turn.params)
  # Half the bytes: the turn reads the bfloat16 copy, not the policy.
  assert {x.dtype for x in jax.tree.leaves(turn.params)} == {
      np.dtype("bfloat16")} and copy * 2 == params
  # The policy stays resident while the copy is read; the repack holds both.
  assert by_name["rl/episode_turn"].resident == (
      by_name["rl/episode_prefill"].resident)
  assert by_name["rl/episode_repack"].resident == (
      by_name["rl/episode_turn"].resident + copy)


def test_episode_programs_compile_on_a_2x4_mesh_with_the_real_shardings():
  config = _config()
  model_config, _, rules = pipeline.plan_context(config)
  mesh = mesh_lib.make_mesh(dict(data=2, fsdp=4, tensor=1))
  task = config.task
  rows = 16
  with mesh_lib.activate(mesh, rules):
    params = plan.abstract_params(model_config, mesh)
    builders = plan.episode_programs(task, model_config, params, mesh, rows,
                                     mesh.size)
    reports = {b.name: plan.measure(b.build(rows)) for b in builders}
    # The turn's stand-in cache has the shardings of a real cache: the
    # same program on a concrete one compiles to the same memory.
    turn = {b.name: b for b in builders}["rl/episode_turn"].build(rows)
    real_cache = model_lib.init_cache(model_config, rows, turn.length)
    real_params = jax.device_put(
        models.init_params(model_config, jax.random.key(0)),
        context_lib.param_shardings(model_config, mesh))
    args = (real_params, real_cache) + turn.args[2:]
    real = turn.fn.lower(*args).compile().memory_analysis()
    planned = turn.lower().compile().memory_analysis()
  assert (real.argument_size_in_bytes, real.temp_size_in_bytes) == (
      planned.argument_size_in_bytes, planned.temp_size_in_bytes)
  # Cache slots: P + G + max(turn tokens, observation width) for every
  # program but the prefill's, P + the first segment end + the margin.
  largest = task.max_prompt_len + task.max_new_tokens + max(
      task.max_turn_tokens, 8)
  assert turn.length == largest == reports["rl/episode_turn"].length
  per_device = _cache_bytes(model_config.num_layers, rows // 2 // 4, largest,
                            model_config.num_kv_heads, model_config.head_dim,
                            4)
  assert reports["rl/episode_turn"].kv_cache == per_device
  assert reports["rl/episode_repack"].kv_cache == 2 * per_device
  for name, report in reports.items():
    assert report.total > 0 and report.activations >= 0, name
    assert report.params == (0 if name == "rl/episode_repack" else
                             plan.per_device_bytes(params)), name


@pytest.mark.slow
def test_episode_programs_plan_at_qwen_1_5b_shapes_without_allocating():
  config = _config(hf_path=os.path.join(ROOT, "configs", "hf_shapes",
                                        "qwen2.5-1.5b"), scan_layers=True)
  model_config, mesh, rules = pipeline.plan_context(config)
  assert mesh.size == 8 and model_config.num_layers == 28
  before = sum(x.nbytes for x in jax.live_arrays())
  with mesh_lib.activate(mesh, rules):
    builders = [b for b in plan.pipeline_programs(config, model_config, mesh)
                if b.name in EPISODE_PROGRAMS]
    reports = plan.plan(builders, largest_batch=False)
  # Nothing was materialised: 1.5 B float32 parameters would be 6 GB.
  assert sum(x.nbytes for x in jax.live_arrays()) - before < 2**20
  assert [r.name for r in reports] == EPISODE_PROGRAMS
  rows = config.rl.prompts_per_step * config.rl.group_size
  # Parameters replicated over `data` (8 ways): every device holds them.
  params = 4 * models.num_params(model_config)
  slots = reports[1].length
  for r in reports:
    assert r.rows == rows
    if r.name != "rl/episode_repack":
      assert r.params == params
  assert reports[1].kv_cache == _cache_bytes(28, rows // 8, slots, 2, 128, 4)
  # Resident while a turn runs: the reference policy, and the policy's
  # parameters' Adam moments (its parameters are the turn's own).
  assert 3 * params <= reports[1].resident < 3 * params + 2**20


class FixedEnv:
  """Never done: replies with the question's first operand lookup."""

  def reset(self, problem):
    return problem.question

  def step(self, action):
    return f"x0={len(action) % 10}\n", 0.0, False, {}


@pytest.mark.parametrize("sizes", [
    dict(data=2, fsdp=4, tensor=1),
    pytest.param(dict(data=8, fsdp=1, tensor=1), marks=pytest.mark.slow)])
def test_sharded_episodes_give_the_tokens_of_one_device(sizes):
  tokenizer = ho.make_tokenizer()
  cfg = models.preset("test", tokenizer.vocab_size)
  problems = ho.make_problems(ho.HiddenOperandsConfig(), "train", range(8))
  newline = tokenizer.encode("\n")[0]
  kwargs = dict(max_prompt_len=24, max_episode_tokens=40, max_turns=4,
                max_turn_tokens=8, max_observation_tokens=8,
                end_of_turn_ids=[newline], eos_id=(),
                temperature=1.0)

  def run(params):
    env = batched.BatchedEnv(FixedEnv)
    return episodes.sample_episodes(cfg, params, env, problems, tokenizer,
                                    jax.random.key(7), **kwargs)

  plain = models.init_params(cfg, jax.random.key(0))
  reference = run(jax.device_put(plain, jax.devices()[0]))
  mesh = mesh_lib.make_mesh(sizes)
  with mesh_lib.activate(mesh):
    shardings = context_lib.param_shardings(cfg, mesh)
    sharded = jax.device_put(plain, shardings)
    out = run(sharded)
  placed = [x.sharding for x in jax.tree.leaves(sharded)]
  assert all(len(s.device_set) == 8 for s in placed)
  if sizes["fsdp"] > 1:
    assert not all(s.is_fully_replicated for s in placed)
  # Several turns with observations between them.
  assert (out.num_turns >= 2).all() and out.observation_mask.any()
  np.testing.assert_array_equal(out.tokens, reference.tokens)
  np.testing.assert_array_equal(out.turn_ids, reference.turn_ids)
  np.testing.assert_allclose(out.logprobs, reference.logprobs, atol=1e-5)
