"""The jitted programs of a run, built in one place.

The stages (`sft`, `rl`, `prm_stages`) jit their update steps and passes with
the constructors here, and the memory planner (`runners.plan`) compiles the
very same programs ahead of time from abstract inputs. So what the planner
reports is what the run compiles. The RL stage's programs are declared once
each, as `Update` (an update step with its optimizer and batch keys) and
`Pass` (a forward pass over each rollout): the policy update here
(`policy_update`), a method's own in its module (`Method.programs`); the
stage jits those declarations and the planner compiles them.

An update step is `jax.jit(step, in_shardings=(state, batch rows),
out_shardings=(state, replicated metrics), donate_argnums=0)`; a pass over a
rollout is a jitted function of (params, tokens, attention_mask) with its
rows split over the mesh's batch axes.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import scoring
from rl_rewards.prm import training
from rl_rewards.sharding import axes
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import nonfinite
from rl_rewards.train import optim
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


def fault(config, step_type: str):
  """The non-finite injection of `debug.nonfinite_steps` for `step_type`
  (one of `config_lib.NONFINITE_TYPES`), or None: every update step below
  passes it to its factory."""
  entries = config_lib.nonfinite_steps(config.debug.nonfinite_steps)
  return nonfinite.fault_fn(entries.get(step_type))


def sft_step_fn(config, model_config, tx):
  """The SFT update (gradient accumulation over `sft.micro_batch_size`)."""
  return steps.make_sft_step(
      model_config, tx, micro_batch_size=config.sft.micro_batch_size,
      chunk_size=config.model.logits_chunk, fault=fault(config, "sft"))


def update_temperature(rl_config) -> float:
  """τ of the policy update and of π_old: the rollout's sampling temperature
  (logits / τ is the distribution that was sampled); 1 for greedy rollouts."""
  return float(rl_config.temperature) if rl_config.temperature > 0 else 1.0


def policy_step_fn(config, model_config, tx):
  """The PPO-clip policy update of `config.rl`."""
  cfg = config.rl
  return steps.make_policy_step(
      model_config, tx, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
      clip_c=cfg.clip_c, loss_agg_mode=cfg.loss_agg_mode,
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
      loss_scale=float(config.task.max_new_tokens),
      micro_batch_size=cfg.micro_batch_size,
      chunk_size=config.model.logits_chunk,
      temperature=update_temperature(cfg), fault=fault(config, "policy"))


def value_step_fn(config, model_config, tx):
  """The PPO critic's clipped value regression."""
  return steps.make_value_step(
      model_config, tx, clip_range=config.rl.ppo.value_clip,
      micro_batch_size=config.rl.micro_batch_size,
      fault=fault(config, "value"))


def implicit_prm_step_fn(config, model_config, tx):
  """PRIME's online implicit-PRM update on outcome labels."""
  cfg = config.rl
  return steps.make_implicit_prm_step(
      model_config, tx, beta=cfg.prime.beta, group_size=cfg.group_size,
      micro_batch_size=cfg.micro_batch_size,
      chunk_size=config.model.logits_chunk,
      fault=fault(config, "implicit_prm"))


def prm_step_fn(config, model_config, tx, *, kind, group_size):
  """The prm stage's update of a `kind` (head | generative | implicit)
  verifier."""
  cfg = config.prm
  if kind == "implicit":
    return training.make_implicit_step(
        model_config, tx, beta=cfg.implicit_beta, loss=cfg.implicit_loss,
        group_size=group_size, micro_batch_size=cfg.micro_batch_size,
        chunk_size=config.model.logits_chunk, fault=fault(config, "prm"))
  return training.make_prm_step(
      model_config, tx, num_steps=config.task.max_steps, model=kind,
      value_weight=cfg.value_weight, balance_classes=cfg.balance_classes,
      micro_batch_size=cfg.micro_batch_size,
      chunk_size=config.model.logits_chunk, fault=fault(config, "prm"))


def logprob_pass(config, model_config, section="rl", temperature=1.0):
  """`(params, tokens, attention_mask) -> [B, T]` log-probs (of logits / τ),
  jitted, over micro-batches of `config.<section>`'s pass size."""
  return jax.jit(steps.make_logprob_fn(
      model_config,
      micro_batch_size=config_lib.pass_micro_batch_size(config[section]),
      chunk_size=config.model.logits_chunk, temperature=temperature))


def values_pass(config, model_config):
  """`(params, tokens, attention_mask) -> [B, T]` value predictions."""
  return jax.jit(steps.make_values_fn(
      model_config,
      micro_batch_size=config_lib.pass_micro_batch_size(config.rl)))


def sampler_weights(config, model_config, mesh):
  """`params -> the copy the RL sampler reads` (see `rl.sampler_dtype` and
  `rl.sampler_gather_fsdp`), jitted with the copy's shardings; the identity
  when neither is set. Made once per RL step, after the update."""
  cfg = config.rl
  if not cfg.sampler_dtype and not cfg.sampler_gather_fsdp:
    return lambda params: params
  dtype = jnp.dtype(cfg.sampler_dtype or "float32")
  rules = mesh_lib.active_rules()
  if cfg.sampler_gather_fsdp:
    rules = mesh_lib.parse_rules(f"{axes.EMBED}=none", base=rules)
  shardings = mesh_lib.logical_to_shardings(
      models.param_logical_axes(model_config), mesh, rules)
  return jax.jit(lambda params: jax.tree.map(lambda x: x.astype(dtype),
                                             params),
                 out_shardings=shardings)


def scorer(config, model_config, kind, params, reference=None, beta=None):
  """The verifier's jitted scorer (`prm.scoring.ModelScorer`) of a trained
  `kind` PRM: what the RL stage calls on every rollout."""
  num_steps = config.task.max_steps
  rows = config_lib.pass_micro_batch_size(config.prm)
  chunk = config.model.logits_chunk
  if kind == "implicit":
    return scoring.implicit_scorer(model_config, params, reference, num_steps,
                                   beta=beta, micro_batch_size=rows,
                                   chunk_size=chunk)
  if kind == "generative":
    return scoring.generative_scorer(model_config, params, num_steps,
                                     micro_batch_size=rows, chunk_size=chunk)
  return scoring.head_scorer(model_config, params, num_steps,
                             micro_batch_size=rows)


# ------------------------------------------------------- declarations ---

ROLLOUT_KEYS = {"tokens": jnp.int32, "attention_mask": jnp.int32,
                "response_mask": jnp.float32}


@dataclasses.dataclass(frozen=True)
class Pass:
  """A forward pass over each rollout with a model the RL stage trains.

  Attributes:
    name: the program's name, e.g. "rl/values".
    model: the trained model whose parameters it reads (its key in the RL
      state).
    heads: the heads of those parameters.
    fn: the jitted `(params, tokens, attention_mask, *inputs) -> [B, T]`.
    inputs: its batch arguments after (tokens, attention_mask), in order:
      {key: (dtype, width)}, width None for [B, T], else [B, width].
  """
  name: str
  model: str
  heads: tuple
  fn: Any
  inputs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Update:
  """The update step of a model the RL stage trains.

  Attributes:
    name: the program's name, e.g. "rl/value_update".
    model: the model's key in the RL state.
    heads: the heads its parameters hold.
    tx: its optimizer (its state is created with it).
    step_fn: the pure `(state, batch) -> (state, metrics)` update.
    dtypes: its batch keys beyond `ROLLOUT_KEYS`.
    rows: "minibatch" (once per policy minibatch) or "rollout" (once per
      rollout, whole groups).
    widths: second dimension of batch keys that are not [B, T] (0: [B]).
  """
  name: str
  model: str
  heads: tuple
  tx: Any
  step_fn: Callable
  dtypes: dict
  rows: str = "minibatch"
  widths: dict = dataclasses.field(default_factory=dict)

  def jit(self, state_shardings, mesh):
    """The step jitted as the stage runs it (`jit_update`)."""
    return jit_update(self.step_fn, state_shardings, mesh)


def policy_update(config, model_config) -> Update:
  """The PPO-clip policy update of the RL stage (`policy_step_fn`)."""
  cfg = config.rl
  tx = rl_optimizer(cfg, cfg.learning_rate)
  dtypes = {"old_logprobs": jnp.float32, "advantages": jnp.float32}
  if cfg.kl_coef > 0:
    dtypes["ref_logprobs"] = jnp.float32
  return Update("rl/policy_update", "policy", ("lm",), tx,
                policy_step_fn(config, model_config, tx), dtypes)
