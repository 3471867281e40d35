"""The memory planner: what each jitted program of a pipeline needs per device.

Before a costly launch, `plan` compiles every program of the configured
pipeline (SFT update, rollout sampler, reference / value / verifier passes,
policy / value / PRM updates) ahead of time for the run's mesh, with abstract
inputs only (`jax.ShapeDtypeStruct`s carrying their shardings: no weights are
materialised), and reads `compiled.memory_analysis()`:

  total = arguments + outputs − aliased (donated) + temporaries

per device. Arguments are split into parameters, optimizer state and the
batch; temporaries are the activations (and, for the sampler, the KV cache,
also given on its own). The stage's other state that stays on the devices
while the program runs (e.g. the policy's optimizer state during the
rollout, the reference policy during the update) is added as `resident`;
`peak = total + resident` is what must fit.

The numbers are XLA:CPU's. The CPU compiler computes bfloat16 matmuls in
float32 and upcasts their operands, so for bfloat16 models the activations
(and the sampler's cache temporaries) are overstated: plans are
conservative there. The programs are built by `runners.programs` and the
methods' declarations (`Method.programs`), the same constructors and
declarations the stages jit and run, so the numbers are those of the real
run.

The largest batch that fits comes from a second compile at half the rows:
memory is affine in the rows of a program (`a + b·rows`), so two compiles
give the rows at which `peak` reaches the device's memory.
"""

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import models
from rl_rewards.models import model as model_lib
from rl_rewards.rollout import episodes
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import methods as methods_lib
from rl_rewards.runners import programs
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import state as state_lib

GIB = 1024.0 ** 3


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


def multi_turn(config) -> bool:
  """Whether `config.task` rolls out multi-turn episodes
  (`rollout.episodes.sample_episodes`) instead of single-turn samples."""
  return config.task.name in MULTI_TURN_TASKS


# Tasks whose rollout is `rollout.episodes.sample_episodes`.
MULTI_TURN_TASKS = ("hidden_operands",)
# The episode rollout's own jitted steps and widths, planned as it runs them.
# pylint: disable=protected-access
_episode_repack = episodes._repack
_episode_observations = episodes._append_observations
_observation_width = episodes._observation_width
# pylint: enable=protected-access


def _abstract_cache(model_config, rows, slots):
  """A `KVCache` of `rows` x `slots` as sharded `ShapeDtypeStruct`s: the
  shardings `init_cache` gives it under the active mesh and rules."""
  init = jax.jit(lambda: model_lib.init_cache(model_config, rows, slots))
  lowered = init.lower()
  return context_lib.abstract_like(lowered.out_info,
                                   lowered.compile().output_shardings)


def episode_programs(task, model_config, params, mesh, rows: int,
                     unit: int) -> list[ProgramBuilder]:
  """The programs of a multi-turn rollout (`episodes.sample_episodes`) of
  `task` (the config's section), as builders by rows (`rows` global rows,
  in multiples of `unit`), each at its largest shapes:

  * `rl/episode_prefill`: the prompts [B, P] into a new cache of the first
    size, P + `max_turn_tokens` rounded up to a cache size
    (`episodes.cache_sizes`);
  * `rl/episode_turn`: one policy turn (`sampler.decode_from_cache`, up to
    `max_turn_tokens` tokens) in the largest cache, P + G + margin slots
    (G = `max_new_tokens`, the episode's slots after the prompt);
  * `rl/episode_repack`: the cache repacked before a turn (a copy: the
    input cache and the repacked one are both live);
  * `rl/episode_observation`: an observation of `max_observation_tokens`
    (its padded width) repacked into and prefilled in the largest cache.

  Sampling is at temperature 1 (the noise of the turn is precomputed where
  `sampler.decode_from_cache` does). The KV cache of each is given apart
  (`kv_cache`, twice for the repack): an argument of the turn, repack and
  observation programs (so part of their `inputs`), an output of the
  prefill.
  """
  prompt_len, total = task.max_prompt_len, task.max_new_tokens
  turn_tokens = task.max_turn_tokens
  obs_width = _observation_width(task.max_observation_tokens,
                                 task.max_observation_tokens)
  sizes = episodes.cache_sizes(prompt_len, total, max(turn_tokens, obs_width))
  first = next(s for s in sizes if s >= prompt_len + turn_tokens)
  largest = sizes[-1]
  batch = mesh_lib.batch_sharding(mesh)
  replicated = mesh_lib.replicated(mesh)
  vocab = model_config.vocab_size

  def rows_of(n, width, dtype):
    return jax.ShapeDtypeStruct((n, width), dtype, sharding=batch)

  def per_row(n, dtype):
    return jax.ShapeDtypeStruct((n,), dtype, sharding=batch)

  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
  key = jax.eval_shape(lambda: jax.random.key(0))

  def prefill(n):
    fn = jax.jit(lambda p, t, m: model_lib.apply(
        model_config, p, t, attention_mask=m,
        cache=model_lib.init_cache(model_config, n, first), cache_index=0,
        last_only=True))
    return Program("rl/episode_prefill", n, first, fn,
                   (params, rows_of(n, prompt_len, jnp.int32),
                    rows_of(n, prompt_len, jnp.bool_)), params=params,
                   kv_cache=kv_cache_bytes(model_config, mesh, n, first))

  def turn(n):
    fn = jax.jit(lambda p, cache, logits, positions, index, budgets,
                 offsets, rng: sampler.decode_from_cache(
                     model_config, p, cache, logits, positions, index, rng,
                     budgets=budgets, noise_offsets=offsets,
                     max_new_tokens=turn_tokens, temperature=1.0, top_p=1.0,
                     eos_id=0, pad_id=0))
    return Program("rl/episode_turn", n, largest, fn,
                   (params, _abstract_cache(model_config, n, largest),
                    rows_of(n, vocab, jnp.float32), per_row(n, jnp.int32),
                    scalar, per_row(n, jnp.int32), per_row(n, jnp.int32),
                    key), params=params,
                   kv_cache=kv_cache_bytes(model_config, mesh, n, largest))

  def repack(n):
    fn = jax.jit(lambda cache, keep, end: _episode_repack(
        cache, keep, end, max_len=largest))
    return Program("rl/episode_repack", n, largest, fn,
                   (_abstract_cache(model_config, n, largest),
                    per_row(n, jnp.bool_), scalar),
                   kv_cache=2 * kv_cache_bytes(model_config, mesh, n,
                                               largest))

  def observation(n):
    fn = jax.jit(lambda p, cache, logits, keep, tokens, mask, end:
                 _episode_observations(
                     p, cache, logits, keep, tokens, mask, end,
                     cfg=model_config, max_len=largest))
    return Program("rl/episode_observation", n, largest, fn,
                   (params, _abstract_cache(model_config, n, largest),
                    rows_of(n, vocab, jnp.float32), per_row(n, jnp.bool_),
                    rows_of(n, obs_width, jnp.int32),
                    rows_of(n, obs_width, jnp.bool_), scalar),
                   params=params,
                   kv_cache=kv_cache_bytes(model_config, mesh, n, largest))

  return [ProgramBuilder(name, rows, unit, build) for name, build in (
      ("rl/episode_prefill", prefill), ("rl/episode_turn", turn),
      ("rl/episode_repack", repack), ("rl/episode_observation", observation))]


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


def _pass(name, rows, unit, length, fn, params, mesh, inputs=None):
  def build(n):
    batch = _rows(mesh, n, length, {"tokens": jnp.int32,
                                    "attention_mask": jnp.int32})
    extra = [jax.ShapeDtypeStruct(
        (n, length if width is None else width), dtype,
        sharding=mesh_lib.batch_sharding(mesh))
             for dtype, width in (inputs or {}).values()]
    return Program(name, n, length, fn,
                   (*params, batch["tokens"], batch["attention_mask"],
                    *extra), params=params)
  return ProgramBuilder(name, rows, unit, build)


_TOKENS = {"tokens": jnp.int32, "attention_mask": jnp.int32}
_ROLLOUT = programs.ROLLOUT_KEYS


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
    tx = programs.sft_optimizer(config.sft)
    state, shardings = abstract_state(model_config, mesh, tx)
    fn = programs.jit_update(programs.sft_step_fn(config, model_config, tx),
                             shardings, mesh)
    builders.append(_update("sft/update", config.sft.batch_size, ways, length,
                            fn, state, dict(_TOKENS, loss_mask=jnp.int32),
                            mesh))

  if "prm" in stages:
    cfg = config.prm
    kind = cfg.model
    heads = {"head": ("score",), "generative": ("lm", "score"),
             "implicit": ("lm",)}[kind]
    group = config.labels.samples_per_problem
    tx = programs.prm_optimizer(cfg)
    state, shardings = abstract_state(model_config, mesh, tx, heads)
    fn = programs.jit_update(
        programs.prm_step_fn(config, model_config, tx, kind=kind,
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
      copied = programs.sampler_weights(config, model_config,
                                        mesh).lower(policy)
      sampled = context_lib.abstract_like(
          copied.out_info, copied.compile().output_shardings)
    if multi_turn(config):
      episode = episode_programs(task, model_config, sampled, mesh,
                                 rollout_rows, ways * cfg.group_size)
      builders.extend(episode)
      rollout_names = [b.name for b in episode
                       if b.name != "rl/episode_repack"]
      if cfg.sampler_dtype or cfg.sampler_gather_fsdp:
        # The sampler's copy is live while the cache is repacked, but not
        # one of the repack's arguments (the policy's state is counted in
        # `live` already).
        consumed["rl/episode_repack"] = -per_device_bytes(sampled)
    else:
      rollout_names = ["rl/rollout"]
      builders.append(ProgramBuilder(
          "rl/rollout", rollout_rows, ways * cfg.group_size,
          lambda rows: _sampler_program(
              "rl/rollout", model_config, sampled, mesh,
              rows // cfg.group_size, task.max_prompt_len,
              task.max_new_tokens, cfg.group_size)))
    method = methods_lib.make(config)
    if cfg.kl_coef > 0 or method.reads_reference:
      builders.append(_pass("rl/reference_logprobs", rollout_rows, ways,
                            length, programs.logprob_pass(config,
                                                          model_config),
                            (policy,), mesh))
      consumed["rl/reference_logprobs"] = live["reference"]
    if method.reads_step_scores and cfg.prm_source == "model":
      kind = config.prm.model
      heads = {"head": ("score",), "generative": ("lm", "score"),
               "implicit": ("lm",)}[kind]
      prm_params = abstract_params(model_config, mesh, heads)
      model_scorer = programs.scorer(config, model_config, kind, prm_params,
                                     reference=policy,
                                     beta=config.prm.implicit_beta)

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
    if not (cfg.sampler_dtype or cfg.sampler_gather_fsdp):
      for name in rollout_names:
        consumed[name] = per_device_bytes(policy)
    # The policy update, then the method's own programs: the declarations
    # the RL stage jits.
    declared = ((programs.policy_update(config, model_config),) +
                tuple(method.programs(model_config)))
    for planned in declared:
      if isinstance(planned, programs.Pass):
        params = abstract_params(model_config, mesh, planned.heads)
        builders.append(_pass(planned.name, rollout_rows, ways, length,
                              planned.fn, (params,), mesh, planned.inputs))
        consumed[planned.name] = per_device_bytes(params)
        continue
      state, shardings = abstract_state(model_config, mesh, planned.tx,
                                        planned.heads)
      fn = planned.jit(shardings, mesh)
      whole = planned.rows == "rollout"
      builders.append(_update(
          planned.name, rollout_rows if whole else minibatch,
          ways * cfg.group_size if whole else ways, length, fn, state,
          dict(_ROLLOUT, **planned.dtypes), mesh, planned.widths))
      live[planned.model] = consumed[planned.name] = per_device_bytes(state)
    for builder in builders[first_rl:]:
      builder.resident = sum(live.values()) - consumed.get(builder.name, 0)
  return builders


@dataclasses.dataclass
class ProgramMemory:
  """Per-device bytes of one compiled program.

  Attributes:
    name: program name, `stage/what` (e.g. `rl/policy_update`).
    rows: global batch rows it was compiled for.
    length: sequence length (slots) of its rows.
    params: parameter bytes (every model the program reads).
    optimizer: optimizer-state bytes.
    inputs: the other arguments (batch arrays, keys).
    activations: temporaries (`temp_size_in_bytes`).
    kv_cache: the sampler's KV cache (part of `activations`; for the
      episode programs, part of `inputs`, see `episode_programs`), else 0.
    total: arguments + outputs − aliased + temporaries.
    resident: the stage's other state on the devices meanwhile (models and
      optimizer states this program does not take as arguments).
    peak: total + resident, what must fit the device.
    compile_s: seconds to lower and compile.
    bytes_per_row: d total / d rows (from a second compile; None if not
      measured).
  """
  name: str
  rows: int
  length: int
  params: int
  optimizer: int
  inputs: int
  activations: int
  kv_cache: int
  total: int
  resident: int
  compile_s: float
  bytes_per_row: Optional[float] = None

  @property
  def peak(self) -> int:
    return self.total + self.resident

  def largest_rows(self, limit_bytes: float, unit: int) -> int:
    """Rows (a multiple of `unit`) at which `peak` stays within the limit."""
    if self.bytes_per_row is None or self.bytes_per_row <= 0:
      return self.rows if self.peak <= limit_bytes else 0
    fixed = self.peak - self.bytes_per_row * self.rows
    rows = int((limit_bytes - fixed) // self.bytes_per_row)
    return max(rows // unit * unit, 0)


def measure(program: Program,
            resident: int = 0) -> ProgramMemory:
  """Compiles `program` and returns its per-device memory."""
  t0 = time.time()
  compiled = program.lower().compile()
  seconds = time.time() - t0
  mem = compiled.memory_analysis()
  params = per_device_bytes(program.params)
  optimizer = per_device_bytes(program.optimizer)
  arguments = int(mem.argument_size_in_bytes)
  total = (arguments + int(mem.output_size_in_bytes) -
           int(mem.alias_size_in_bytes) + int(mem.temp_size_in_bytes))
  return ProgramMemory(
      name=program.name, rows=program.rows, length=program.length,
      params=params, optimizer=optimizer,
      inputs=max(arguments - params - optimizer, 0),
      activations=int(mem.temp_size_in_bytes), kv_cache=program.kv_cache,
      total=total, resident=resident, compile_s=seconds)


def plan(builders: Sequence[ProgramBuilder], *,
         largest_batch: bool = True,
         progress: Optional[Callable[[str], None]] = None
         ) -> list[ProgramMemory]:
  """Measures every program; with `largest_batch`, also its bytes per row.

  Args:
    builders: from `pipeline_programs`.
    largest_batch: compile each program a second time at half its rows
      (rounded to its row unit) to get the bytes each row adds.
    progress: called with a line per compile.

  Returns:
    One `ProgramMemory` per program, in pipeline order.
  """
  out = []
  for builder in builders:
    program = builder.build(builder.rows)
    report = measure(program, builder.resident)
    if progress:
      progress(f"{report.name}: {report.peak / GIB:.2f} GiB per device "
               f"(compiled in {report.compile_s:.1f} s)")
    half = builder.rows // 2 // builder.unit * builder.unit
    if largest_batch and half > 0:
      smaller = measure(builder.build(half))
      report.bytes_per_row = (report.total - smaller.total) / (
          builder.rows - half)
    out.append(report)
  return out


def check_fits(reports: Sequence[ProgramMemory], device_memory_gb: float):
  """Raises ValueError naming every program whose peak exceeds the device."""
  limit = device_memory_gb * GIB
  too_big = [r for r in reports if r.peak > limit]
  if too_big:
    lines = "; ".join(f"{r.name} needs {r.peak / GIB:.2f} GiB" for r in
                      too_big)
    raise ValueError(f"does not fit {device_memory_gb:g} GiB per device: "
                     f"{lines}.")


def format_table(reports: Sequence[ProgramMemory],
                 builders: Sequence[ProgramBuilder],
                 device_memory_gb: Sequence[float]) -> str:
  """A Markdown table: one row per program, per-device GiB by part, and the
  largest rows that fit each device memory."""
  units = {b.name: b.unit for b in builders}
  head = ["step", "rows x len", "params", "optimizer", "inputs",
          "activations", "KV cache", "program", "+ resident", "peak"]
  head += [f"fits {g:g} GB / max rows" for g in device_memory_gb]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in reports:
    cells = [r.name, f"{r.rows} x {r.length}"] + [
        f"{x / GIB:.2f}" for x in (r.params, r.optimizer, r.inputs,
                                   r.activations, r.kv_cache, r.total,
                                   r.resident, r.peak)]
    for gb in device_memory_gb:
      limit = gb * GIB
      fits = "yes" if r.peak <= limit else "**no**"
      rows = r.largest_rows(limit, units[r.name])
      # Micro-batched programs barely grow with rows (only their inputs do).
      cells.append(f"{fits} / {rows if rows < 100_000 else '> 100k'}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
