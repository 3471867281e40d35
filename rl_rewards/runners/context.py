"""What every stage of a run shares: mesh, task, model config, workdir files.

`RunContext` is a plain record built once by the pipeline; stages read from it
and never mutate it. The state helpers here place parameters and optimizer
state on the mesh (shardings inferred from logical axis names) and build the
abstract targets checkpoints restore into.
"""

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import checkpoints
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.sharding import axes
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import state as state_lib


# The meta key of a checkpoint holding the number of metrics records written
# when it was taken: a resumed stage truncates metrics.jsonl back to it.
METRICS_POSITION = "metrics_records"


@dataclasses.dataclass
class RunContext:
  config: Any                      # The full (validated) ConfigDict.
  workdir: str
  mesh: jax.sharding.Mesh
  task: Any                        # runners.tasks.ArithTask (or another).
  model_config: models.ModelConfig
  writer: metrics_lib.MetricsWriter
  stage_order: list
  rules: tuple = axes.DEFAULT_RULES  # Logical -> mesh axes (config.mesh.rules).
  start_time: float = dataclasses.field(default_factory=time.time)

  def checkpointer(self, stage: str) -> checkpoints.Checkpointer:
    """The stage's checkpoints; each one records how many metrics records
    the workdir held when it was written (`METRICS_POSITION`)."""
    return checkpoints.Checkpointer(
        os.path.join(self.workdir, "checkpoints", stage),
        max_to_keep=self.config.checkpoint.max_to_keep,
        async_save=self.config.checkpoint.async_save,
        extra_meta=lambda: {METRICS_POSITION: self.writer.num_records})

  def rng(self, stream: str, step: int = 0) -> jax.Array:
    """A key that depends only on (seed, stream, step): exact resume."""
    key = jax.random.key(self.config.seed)
    key = jax.random.fold_in(key, _stable_hash(stream))
    return jax.random.fold_in(key, step)


def _stable_hash(text: str) -> int:
  value = 0
  for ch in text.encode():
    value = (value * 131 + ch) % (2**31 - 1)
  return value


def param_shardings(model_config, mesh, heads=("lm",)):
  """NamedShardings of the parameters, from their logical axis names and the
  active rules table (`mesh_lib.activate`; the default table outside it)."""
  logical = models.param_logical_axes(model_config, heads=heads)
  return mesh_lib.logical_to_shardings(logical, mesh)


def _flat_shapes(tree) -> dict:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(_path_key(path)): tuple(np.shape(leaf))
          for path, leaf in flat}


def check_params_match(model_config, params, heads, source: str):
  """Raises ConfigError when `params` are not shaped for `model_config`.

  Args:
    model_config: this run's model.
    params: parameters loaded from elsewhere (another run's checkpoint).
    heads: the heads `params` should have.
    source: what they came from, for the message (e.g. "config.sft.init_from:
      /runs/a").
  """
  expected = _flat_shapes(models.abstract_params(model_config, heads=heads))
  got = _flat_shapes(params)
  problems = [f"{k} has shape {got[k]}, this model needs {expected[k]}"
              for k in expected if k in got and got[k] != expected[k]]
  missing = sorted(set(expected) - set(got))
  unexpected = sorted(set(got) - set(expected))
  if missing:
    problems.append(f"missing {', '.join(missing[:4])}")
  if unexpected:
    problems.append(f"unexpected {', '.join(unexpected[:4])}")
  if problems:
    raise config_lib.ConfigError(
        f"{source}: the saved parameters do not fit this run's model (were "
        f"they trained with another model config?): {'; '.join(problems[:4])}"
        f"{' ...' if len(problems) > 4 else ''}.")


def check_param_shardings(model_config, mesh, heads=("lm", "score")):
  """Raises ConfigError when the mesh splits a parameter dimension unevenly.

  Uses the active rules table (call inside `mesh_lib.activate`).
  """
  shapes = models.abstract_params(model_config, heads=heads)
  logical = models.param_logical_axes(model_config, heads=heads)
  shardings = param_shardings(model_config, mesh, heads)
  flat, _ = jax.tree_util.tree_flatten_with_path(shapes)
  for (path, leaf), names, sharding in zip(
      flat, jax.tree.leaves(logical, is_leaf=lambda x: isinstance(
          x, jax.sharding.PartitionSpec)), jax.tree.leaves(shardings)):
    for dim, entry in enumerate(sharding.spec):
      axes_of_dim = (() if entry is None else
                     entry if isinstance(entry, tuple) else (entry,))
      ways = int(np.prod([mesh.shape[a] for a in axes_of_dim]))
      if leaf.shape[dim] % ways:
        key = (f"config.mesh.{axes_of_dim[0]}" if len(axes_of_dim) == 1
               else "config.mesh")
        split = " x ".join(f"{a}={mesh.shape[a]}" for a in axes_of_dim)
        raise config_lib.ConfigError(
            f"{key}: {split} splits dimension {dim} ('{names[dim]}', size "
            f"{leaf.shape[dim]}) of parameter {'/'.join(_path_key(path))} "
            f"{tuple(leaf.shape)} into {ways} parts, which does not divide it; "
            "choose mesh sizes that divide it, or map that logical axis to "
            "other mesh axes with config.mesh.rules.")


def place_params(ctx: RunContext, params, heads=("lm",), source: str = ""):
  """Host or device parameters -> on the mesh with their shardings.

  With `source` (where they came from, named in errors) the parameters are
  first checked against this run's model: see `check_params_match`.
  """
  if source:
    check_params_match(ctx.model_config, params, heads, source)
  return jax.device_put(params,
                        param_shardings(ctx.model_config, ctx.mesh, heads))


def state_shardings(params, model_config, mesh, tx, heads=("lm",)):
  """Shardings of a `TrainState`: optimizer moments follow their params.

  Args:
    params: the parameters (arrays or `ShapeDtypeStruct`s).
    model_config: their model config.
    mesh: the device mesh.
    tx: the optimizer whose state is sharded.
    heads: the model's heads.
  """
  p_shard = param_shardings(model_config, mesh, heads)
  abstract_params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  repl = mesh_lib.replicated(mesh)
  flat_params, _ = jax.tree_util.tree_flatten_with_path(abstract_params)
  by_path = {}
  for (path, leaf), sharding in zip(flat_params, jax.tree.leaves(p_shard)):
    by_path[_path_key(path)] = (leaf.shape, sharding)

  def opt_leaf_sharding(path, leaf):
    # optax moments (mu, nu, ...) repeat the params' tree below their own
    # node; match on the longest path suffix with the same shape.
    key = _path_key(path)
    for start in range(len(key)):
      hit = by_path.get(key[start:])
      if hit is not None and hit[0] == leaf.shape:
        return hit[1]
    return repl

  opt_shard = jax.tree_util.tree_map_with_path(opt_leaf_sharding, abstract_opt)
  return state_lib.TrainState(step=repl, params=p_shard, opt_state=opt_shard,
                              skipped=repl)


def _path_key(path):
  return tuple(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p))))
               for p in path)


def create_state(model_config, mesh, params, tx, heads=("lm",)):
  """A fresh TrainState on the mesh, and its shardings."""
  shardings = state_shardings(params, model_config, mesh, tx, heads)
  params = jax.device_put(params, shardings.params)
  state = jax.jit(lambda p: state_lib.create(p, tx),
                  out_shardings=shardings)(params)
  return state, shardings


def abstract_like(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings)


def host_scalars(metrics: dict) -> dict:
  """Device metrics -> Python floats (one transfer)."""
  values = jax.device_get(metrics)
  return {k: float(np.asarray(v)) for k, v in values.items()}


def tree_equal(a, b) -> bool:
  leaves = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.all(x == y), a, b))
  return bool(all(bool(x) for x in leaves))
