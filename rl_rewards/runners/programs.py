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

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import scoring
from rl_rewards.prm import training
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.sharding import axes
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import nonfinite
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
      model_config, tx, clip_range=config.rl.value_clip,
      micro_batch_size=config.rl.micro_batch_size,
      fault=fault(config, "value"))


def implicit_prm_step_fn(config, model_config, tx):
  """PRIME's online implicit-PRM update on outcome labels."""
  cfg = config.rl
  return steps.make_implicit_prm_step(
      model_config, tx, beta=cfg.prime_beta, group_size=cfg.group_size,
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
  # Per-device bytes of the stage's state that stays on the devices while
  # this program runs but is not one of its arguments (e.g. the policy's
  # optimizer state during the rollout).
  resident: int = 0


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a pytree of sharded abstract arrays (the
  largest shard, so uneven splits count their padding)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.shape
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
      shape = sharding.shard_shape(shape)
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


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


class _ScorerProgram:
  """Adapts a `ModelScorer` to `Program.fn` (`lower(*args)`)."""

  def __init__(self, model_scorer):
    self._scorer = model_scorer

  def lower(self, *args):
    return self._scorer.lower(*args)


def _update(name, rows, unit, length, fn, state, dtypes, mesh, widths=None):
  """A builder of an update step's program; `widths` gives the second
  dimension of arrays that are not [B, T] (e.g. [B, S] step targets)."""
  widths = widths or {}

  def build(n):
    sharding = mesh_lib.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct(
        (n,) if widths.get(k) == 0 else (n, widths.get(k, length)), dtype,
        sharding=sharding) for k, dtype in dtypes.items()}
    return Program(name, n, length, fn, (state, batch),
                   params=state.params, optimizer=state.opt_state)
  return ProgramBuilder(name, rows, unit, build)


def _pass(name, rows, unit, length, fn, params, mesh):
  def build(n):
    batch = _rows(mesh, n, length, {"tokens": jnp.int32,
                                    "attention_mask": jnp.int32})
    return Program(name, n, length, fn,
                   (*params, batch["tokens"], batch["attention_mask"]),
                   params=params)
  return ProgramBuilder(name, rows, unit, build)


_TOKENS = {"tokens": jnp.int32, "attention_mask": jnp.int32}
_ROLLOUT = dict(_TOKENS, response_mask=jnp.float32)


@dataclasses.dataclass(frozen=True)
class PlannedPass:
  """A forward pass a method runs over each rollout with a model of its own
  (`Method.planned_programs`): `fn(params, tokens, attention_mask)`."""
  name: str
  heads: tuple
  fn: Any


@dataclasses.dataclass(frozen=True)
class PlannedUpdate:
  """An update of a model a method trains beside the policy
  (`Method.planned_programs`).

  Attributes:
    name: the program's name in the plan, e.g. "rl/value_update".
    model: the model's name in the RL state (`Method.models`).
    heads: the heads its parameters hold.
    tx: its optimizer.
    step_fn: the pure `(state, batch) -> (state, metrics)` update.
    dtypes: its batch keys beyond tokens, attention and response masks.
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


def pipeline_programs(config, model_config, mesh) -> list[ProgramBuilder]:
  """Every program the stages of `config` compile, as builders by rows.

  Rows are global batch rows: the SFT batch, the rollout (prompts x group
  size) for the sampler and the passes over it, a PPO minibatch for the
  updates, the PRM batch for the verifier's update.
  """
  stages = [s.strip() for s in config.stages.split(",") if s.strip()]
  task = config.task
  length = task.max_prompt_len + task.max_new_tokens
  num_steps = task.max_steps
  ways = mesh_lib.batch_axis_size(mesh)
  builders = []
  policy = abstract_params(model_config, mesh)

  if "sft" in stages:
    tx = sft_optimizer(config.sft)
    state, shardings = abstract_state(model_config, mesh, tx)
    fn = jit_update(sft_step_fn(config, model_config, tx), shardings, mesh)
    builders.append(_update("sft/update", config.sft.batch_size, ways, length,
                            fn, state, dict(_TOKENS, loss_mask=jnp.int32),
                            mesh))

  if "prm" in stages:
    cfg = config.prm
    kind = cfg.model
    heads = {"head": ("score",), "generative": ("lm", "score"),
             "implicit": ("lm",)}[kind]
    group = config.labels.samples_per_problem
    tx = prm_optimizer(cfg)
    state, shardings = abstract_state(model_config, mesh, tx, heads)
    fn = jit_update(prm_step_fn(config, model_config, tx, kind=kind,
                                group_size=group), shardings, mesh)
    if kind == "implicit":
      dtypes = dict(_ROLLOUT, ref_logprobs=jnp.float32, labels=jnp.float32)
      widths = {"labels": 0}
    else:
      dtypes = dict(_TOKENS, step_ids=jnp.int32, targets=jnp.float32,
                    target_mask=jnp.float32, v_target=jnp.float32,
                    v_mask=jnp.float32)
      widths = {"targets": num_steps, "target_mask": num_steps,
                "v_target": 0, "v_mask": 0}
    builders.append(_update("prm/update", cfg.batch_size, ways * group,
                            length, fn, state, dtypes, mesh, widths))
    # The SFT policy stays on the devices (the RL stage's reference).
    builders[-1].resident = per_device_bytes(policy)

  if "rl" in stages:
    first_rl = len(builders)
    live = {"reference": per_device_bytes(policy)}
    consumed = {}
    cfg = config.rl
    rollout_rows = cfg.prompts_per_step * cfg.group_size
    minibatch = rollout_rows // cfg.minibatches
    sampled = policy
    if cfg.sampler_dtype or cfg.sampler_gather_fsdp:
      # The sampler reads the per-step copy: its dtype and shardings.
      copied = sampler_weights(config, model_config, mesh).lower(policy)
      sampled = context_lib.abstract_like(
          copied.out_info, copied.compile().output_shardings)
    builders.append(ProgramBuilder(
        "rl/rollout", rollout_rows, ways * cfg.group_size,
        lambda rows: _sampler_program(
            "rl/rollout", model_config, sampled, mesh, rows // cfg.group_size,
            task.max_prompt_len, task.max_new_tokens, cfg.group_size)))
    # Methods build programs, so they are imported here, not at the top.
    from rl_rewards.runners import methods as methods_lib  # pylint: disable=g-import-not-at-top
    method = methods_lib.make(config)
    if cfg.kl_coef > 0 or method.reads_reference:
      builders.append(_pass("rl/reference_logprobs", rollout_rows, ways,
                            length, logprob_pass(config, model_config),
                            (policy,), mesh))
      consumed["rl/reference_logprobs"] = live["reference"]
    if method.reads_step_scores and cfg.prm_source == "model":
      kind = config.prm.model
      heads = {"head": ("score",), "generative": ("lm", "score"),
               "implicit": ("lm",)}[kind]
      prm_params = abstract_params(model_config, mesh, heads)
      model_scorer = scorer(config, model_config, kind, prm_params,
                            reference=policy, beta=config.prm.implicit_beta)

      def build_scores(n, model_scorer=model_scorer, prm_params=prm_params):
        batch = _rows(mesh, n, length, dict(_TOKENS, step_ids=jnp.int32))
        return Program("rl/prm_scores", n, length,
                       _ScorerProgram(model_scorer),
                       (batch["tokens"], batch["attention_mask"],
                        batch["step_ids"]), params=prm_params)
      builders.append(ProgramBuilder("rl/prm_scores", rollout_rows, ways,
                                     build_scores))
      live["verifier"] = consumed["rl/prm_scores"] = (
          per_device_bytes(prm_params) +
          (per_device_bytes(policy) if kind == "implicit" else 0))
    tx = rl_optimizer(cfg, cfg.learning_rate)
    state, shardings = abstract_state(model_config, mesh, tx)
    fn = jit_update(policy_step_fn(config, model_config, tx), shardings, mesh)
    dtypes = dict(_ROLLOUT, old_logprobs=jnp.float32, advantages=jnp.float32)
    if cfg.kl_coef > 0:
      dtypes["ref_logprobs"] = jnp.float32
    builders.append(_update("rl/policy_update", minibatch, ways, length, fn,
                            state, dtypes, mesh))
    live["policy"] = consumed["rl/policy_update"] = per_device_bytes(state)
    if not (cfg.sampler_dtype or cfg.sampler_gather_fsdp):
      consumed["rl/rollout"] = per_device_bytes(policy)
    for planned in method.planned_programs(model_config):
      if isinstance(planned, PlannedPass):
        params = abstract_params(model_config, mesh, planned.heads)
        builders.append(_pass(planned.name, rollout_rows, ways, length,
                              planned.fn, (params,), mesh))
        consumed[planned.name] = per_device_bytes(params)
        continue
      state, shardings = abstract_state(model_config, mesh, planned.tx,
                                        planned.heads)
      fn = jit_update(planned.step_fn, shardings, mesh)
      whole = planned.rows == "rollout"
      builders.append(_update(
          planned.name, rollout_rows if whole else minibatch,
          ways * cfg.group_size if whole else ways, length, fn, state,
          dict(_ROLLOUT, **planned.dtypes), mesh, planned.widths))
      live[planned.model] = consumed[planned.name] = per_device_bytes(state)
    for builder in builders[first_rl:]:
      builder.resident = sum(live.values()) - consumed.get(builder.name, 0)
  return builders
