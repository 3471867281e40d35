"""The jitted programs of a run, built in one place.

The stages (`sft`, `rl`, `prm_stages`) jit their update steps and passes with
the constructors here, and the memory planner (`runners.plan`) compiles the
very same programs ahead of time from abstract inputs. So what the planner
reports is what the run compiles.

An update step is `jax.jit(step, in_shardings=(state, batch rows),
out_shardings=(state, replicated metrics), donate_argnums=0)`; a pass over a
rollout is a jitted function of (params, tokens, attention_mask) with its
rows split over the mesh's batch axes.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import models
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import optim
from rl_rewards.train import state as state_lib
from rl_rewards.train import steps


# ----------------------------------------------------------- constructors ---

def rl_optimizer(rl_config, learning_rate):
  """The optimizer of every RL-stage model (policy, value, implicit PRM)."""
  return optim.make_optimizer(
      learning_rate=learning_rate, warmup_steps=rl_config.warmup_steps,
      weight_decay=rl_config.weight_decay, b2=rl_config.b2,
      grad_clip=rl_config.grad_clip)


def sft_optimizer(sft_config):
  return optim.make_optimizer(
      learning_rate=sft_config.learning_rate,
      warmup_steps=sft_config.warmup_steps,
      weight_decay=sft_config.weight_decay, b2=sft_config.b2,
      grad_clip=sft_config.grad_clip)


def prm_optimizer(prm_config):
  return optim.make_optimizer(
      learning_rate=prm_config.learning_rate,
      warmup_steps=prm_config.warmup_steps,
      weight_decay=prm_config.weight_decay, grad_clip=prm_config.grad_clip)


def jit_update(step_fn, state_shardings, mesh):
  """An update step jitted as every stage runs it (the state is donated)."""
  return jax.jit(step_fn,
                 in_shardings=(state_shardings, mesh_lib.batch_sharding(mesh)),
                 out_shardings=(state_shardings, None), donate_argnums=0)


def policy_step_fn(config, model_config, tx):
  cfg = config.rl
  return steps.make_policy_step(
      model_config, tx, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
      clip_c=cfg.clip_c, loss_agg_mode=cfg.loss_agg_mode,
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
      loss_scale=float(config.task.max_new_tokens))


def logprob_pass(model_config):
  """`(params, tokens, attention_mask) -> [B, T]` log-probs, jitted."""
  return jax.jit(steps.make_logprob_fn(model_config))


def values_pass(model_config):
  """`(params, tokens, attention_mask) -> [B, T]` value predictions."""
  return jax.jit(lambda p, t, m: steps.token_values(model_config, p, t, m))


# ------------------------------------------------ abstract inputs (plans) ---

@dataclasses.dataclass
class Program:
  """One jitted function with abstract arguments, ready to lower.

  `params` and `optimizer` are the parts of `args` that are model
  parameters and optimizer state (the planner reports them apart);
  `kv_cache` is the sampler's cache bytes per device (0 elsewhere).
  """
  name: str
  rows: int
  length: int
  fn: Any
  args: tuple
  params: Any = ()
  optimizer: Any = ()
  kv_cache: int = 0

  def lower(self):
    return self.fn.lower(*self.args)


@dataclasses.dataclass
class ProgramBuilder:
  """Builds the `Program` of `name` for a number of global rows."""
  name: str
  rows: int
  unit: int          # Rows come in multiples of this.
  build: Callable[[int], Program]


def abstract_params(model_config, mesh, heads=("lm",)):
  """The parameters as sharded `ShapeDtypeStruct`s (nothing allocated)."""
  shapes = models.abstract_params(model_config, heads=heads)
  shardings = context_lib.param_shardings(model_config, mesh, heads)
  return context_lib.abstract_like(shapes, shardings)


def abstract_state(model_config, mesh, tx, heads=("lm",)):
  """A `TrainState` of sharded `ShapeDtypeStruct`s, and its shardings."""
  shapes = models.abstract_params(model_config, heads=heads)
  shardings = context_lib.state_shardings(shapes, model_config, mesh, tx,
                                          heads)
  state = jax.eval_shape(lambda p: state_lib.create(p, tx), shapes)
  return context_lib.abstract_like(state, shardings), shardings


def _rows(mesh, rows, length, dtypes):
  sharding = mesh_lib.batch_sharding(mesh)
  return {name: jax.ShapeDtypeStruct((rows, length), dtype, sharding=sharding)
          for name, dtype in dtypes.items()}


def _update_program(name, fn, state, rows, length, dtypes, mesh):
  batch = _rows(mesh, rows, length, dtypes)
  return Program(name, rows, length, fn, (state, batch),
                 params=state.params, optimizer=state.opt_state)


def _pass_program(name, fn, params, rows, length, mesh):
  batch = _rows(mesh, rows, length, {"tokens": jnp.int32,
                                     "attention_mask": jnp.int32})
  return Program(name, rows, length, fn,
                 (params, batch["tokens"], batch["attention_mask"]),
                 params=params)


def kv_cache_bytes(model_config, mesh, rows, slots) -> int:
  """Per-device bytes of a KV cache of `rows` x `slots` (rows split over the
  batch axes, KV heads over `tensor` when they divide)."""
  ways = mesh_lib.batch_axis_size(mesh)
  kv_heads = model_config.num_kv_heads
  if kv_heads % mesh.shape["tensor"] == 0:
    kv_heads //= mesh.shape["tensor"]
  per_layer = 2 * -(-rows // ways) * slots * kv_heads * model_config.head_dim
  return (model_config.num_layers * per_layer *
          np.dtype(model_config.dtype).itemsize)


def _sampler_program(name, model_config, params, mesh, prompts, prompt_len,
                     new_tokens, num_samples):
  sharding = mesh_lib.batch_sharding(mesh)
  tokens = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32,
                                sharding=sharding)
  key = jax.eval_shape(lambda: jax.random.key(0))
  fn = jax.jit(lambda p, t, m, r: sampler.sample(
      model_config, p, t, m, r, max_new_tokens=new_tokens, temperature=1.0,
      top_p=1.0, eos_id=0, pad_id=0, num_samples=num_samples))
  rows = prompts * num_samples
  return Program(name, rows, prompt_len + new_tokens, fn,
                 (params, tokens, tokens, key), params=params,
                 kv_cache=kv_cache_bytes(model_config, mesh, rows,
                                         prompt_len + new_tokens))


def pipeline_programs(config, model_config, mesh) -> list[ProgramBuilder]:
  """Every program the stages of `config` compile, as builders by rows."""
  stages = [s.strip() for s in config.stages.split(",") if s.strip()]
  task = config.task
  length = task.max_prompt_len + task.max_new_tokens
  ways = mesh_lib.batch_axis_size(mesh)
  builders = []
  policy = abstract_params(model_config, mesh)

  if "sft" in stages:
    tx = sft_optimizer(config.sft)
    state, shardings = abstract_state(model_config, mesh, tx)
    fn = jit_update(steps.make_sft_step(model_config, tx), shardings, mesh)
    builders.append(ProgramBuilder(
        "sft/update", config.sft.batch_size, ways,
        lambda rows, fn=fn, state=state: _update_program(
            "sft/update", fn, state, rows, length,
            {"tokens": jnp.int32, "attention_mask": jnp.int32,
             "loss_mask": jnp.int32}, mesh)))

  if "rl" in stages:
    cfg = config.rl
    rollout_rows = cfg.prompts_per_step * cfg.group_size
    builders.append(ProgramBuilder(
        "rl/rollout", rollout_rows, ways * cfg.group_size,
        lambda rows: _sampler_program(
            "rl/rollout", model_config, policy, mesh, rows // cfg.group_size,
            task.max_prompt_len, task.max_new_tokens, cfg.group_size)))
    if cfg.kl_coef > 0 or cfg.method == "prime":
      fn = logprob_pass(model_config)
      builders.append(ProgramBuilder(
          "rl/reference_logprobs", rollout_rows, ways,
          lambda rows, fn=fn: _pass_program(
              "rl/reference_logprobs", fn, policy, rows, length, mesh)))
    tx = rl_optimizer(cfg, cfg.learning_rate)
    state, shardings = abstract_state(model_config, mesh, tx)
    fn = jit_update(policy_step_fn(config, model_config, tx), shardings, mesh)
    dtypes = {"tokens": jnp.int32, "attention_mask": jnp.int32,
              "response_mask": jnp.float32, "old_logprobs": jnp.float32,
              "advantages": jnp.float32}
    if cfg.kl_coef > 0:
      dtypes["ref_logprobs"] = jnp.float32
    builders.append(ProgramBuilder(
        "rl/policy_update", rollout_rows // cfg.minibatches, ways,
        lambda rows, fn=fn, state=state: _update_program(
            "rl/policy_update", fn, state, rows, length, dtypes, mesh)))
  return builders
