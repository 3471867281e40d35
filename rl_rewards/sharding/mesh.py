"""Device meshes, logical-to-physical sharding rules, and batch placement.

The mesh always has the three axes `('data', 'fsdp', 'tensor')` with `Auto`
axis types (GSPMD-style propagation; `jax.make_mesh` would default to Explicit
axes in recent JAX, which breaks an embedding gather). Batches are split over
`('data', 'fsdp')`; parameters follow their logical axis names through a rules
table (`axes.DEFAULT_RULES`, with the overrides of `config.mesh.rules`).

Activations are annotated with logical names too (`nn.with_logical_constraint`
in the model), and those annotations only take effect while a mesh and a
rules table are active: every jitted function of a run is traced inside
`activate(mesh, rules)`, which the pipeline enters once for the whole run.
Without it, XLA is free to shard the hidden dimension instead of the batch,
and every device would hold the whole global batch.
"""

import contextlib
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from rl_rewards.sharding import axes

P = jax.sharding.PartitionSpec
NamedSharding = jax.sharding.NamedSharding


def maybe_initialize_distributed():
  """Calls `jax.distributed.initialize()` on a multi-host launch.

  A multi-host launch is recognised by the coordinator address in the
  environment (`JAX_COORDINATOR_ADDRESS`) or by a cluster environment JAX can
  detect itself (Cloud TPU pods, SLURM); single-host runs do nothing.
  """
  import os  # pylint: disable=g-import-not-at-top
  if jax.distributed.is_initialized():
    return
  if os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get(
      "SLURM_JOB_ID") or os.environ.get("TPU_WORKER_HOSTNAMES"):
    jax.distributed.initialize()


def make_mesh(sizes: Mapping[str, int], devices=None) -> jax.sharding.Mesh:
  """Builds a `('data', 'fsdp', 'tensor')` mesh; one size may be -1.

  Args:
    sizes: mapping with keys `data`, `fsdp`, `tensor` to axis sizes; -1 means
      "all remaining devices".
    devices: devices to use (default: all of `jax.devices()`).

  Returns:
    A `jax.sharding.Mesh` with Auto axis types.

  Raises:
    ValueError: if the sizes do not multiply to the device count.
  """
  devices = np.asarray(jax.devices() if devices is None else devices)
  shape = [int(sizes[name]) for name in axes.MESH_AXES]
  num = devices.size
  if shape.count(-1) > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {dict(sizes)}.")
  if -1 in shape:
    known = int(np.prod([s for s in shape if s != -1]))
    if known <= 0 or num % known:
      raise ValueError(
          f"mesh: {dict(sizes)} does not divide the {num} available devices.")
    shape[shape.index(-1)] = num // known
  if int(np.prod(shape)) != num:
    raise ValueError(
        f"mesh: axis sizes {dict(zip(axes.MESH_AXES, shape))} multiply to "
        f"{int(np.prod(shape))}, but {num} devices are available.")
  return jax.sharding.Mesh(
      devices.reshape(shape), axes.MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def batch_axis_size(mesh: jax.sharding.Mesh) -> int:
  """Number of ways a batch is split (the product of `data` and `fsdp`)."""
  return mesh.shape[axes.DATA] * mesh.shape[axes.FSDP]


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Sharding of batch-first arrays: rows split over `('data', 'fsdp')`."""
  return NamedSharding(mesh, P((axes.DATA, axes.FSDP)))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_divides(batch_size: int, mesh: jax.sharding.Mesh, what: str):
  """Raises a clear error when a batch cannot be split evenly over the mesh."""
  ways = batch_axis_size(mesh)
  if batch_size % ways:
    raise ValueError(
        f"{what}: batch size {batch_size} is not divisible by the "
        f"{ways}-way data parallelism of the mesh {dict(mesh.shape)}; choose "
        f"a multiple of {ways}.")


def parse_rules(overrides: str = "",
                base: Sequence[tuple[str, object]] = axes.DEFAULT_RULES
                ) -> tuple[tuple[str, object], ...]:
  """The rules table: `base` with the entries named in `overrides` replaced.

  Args:
    overrides: comma-separated `logical=mesh_axes` entries, where mesh_axes is
      `none` (replicated), one mesh axis, or several joined by `+`; e.g.
      `"vocab=none,act_batch=data+fsdp,mlp=tensor"`. Empty keeps `base`.
    base: the table to start from.

  Returns:
    A tuple of `(logical_name, mesh_axis | tuple of mesh axes | None)`, in
    `base`'s order.

  Raises:
    ValueError: naming `config.mesh.rules` for an unknown logical name, an
      unknown mesh axis or a malformed entry.
  """
  table = dict(base)
  for entry in filter(None, (e.strip() for e in overrides.split(","))):
    name, sep, value = entry.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
      raise ValueError(f"config.mesh.rules: malformed entry {entry!r}; "
                       "expected logical=mesh_axis (e.g. 'vocab=none').")
    if name not in table:
      raise ValueError(f"config.mesh.rules: unknown logical axis {name!r}; "
                       f"expected one of {sorted(table)}.")
    if value.lower() == "none":
      table[name] = None
      continue
    parts = tuple(v.strip() for v in value.split("+"))
    unknown = [v for v in parts if v not in axes.MESH_AXES]
    if unknown:
      raise ValueError(f"config.mesh.rules: {name}={value} names unknown mesh "
                       f"axes {unknown}; the mesh axes are {axes.MESH_AXES}.")
    table[name] = parts[0] if len(parts) == 1 else parts
  return tuple(table.items())


@contextlib.contextmanager
def activate(mesh: jax.sharding.Mesh,
             rules: Sequence[tuple[str, object]] = axes.DEFAULT_RULES):
  """Makes the model's activation constraints take effect.

  Inside this context `nn.with_logical_constraint` maps logical names to mesh
  axes through `rules` and constrains arrays on `mesh`; outside it the
  constraints are silently ignored. Functions must be traced (first called,
  or lowered) inside it. The rules are not part of jit's cache key, so one
  process should use one rules table per mesh.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
    yield


def active_rules() -> tuple[tuple[str, object], ...]:
  """The rules table of the enclosing `activate`, else `axes.DEFAULT_RULES`."""
  rules = nn.get_logical_axis_rules()
  return tuple(rules) if rules else axes.DEFAULT_RULES


def logical_to_shardings(logical_specs, mesh: jax.sharding.Mesh,
                         rules: Sequence[tuple[str, object]] | None = None):
  """Maps a pytree of logical PartitionSpecs to NamedShardings on `mesh`.

  `rules` defaults to the active table (see `active_rules`).
  """
  rules = active_rules() if rules is None else rules
  return nn.logical_to_mesh_sharding(logical_specs, mesh, list(rules))


def put_batch(batch, mesh: jax.sharding.Mesh):
  """Places a pytree of global host arrays on the mesh, rows split over data.

  Every process holds the same global batch (inputs are deterministic
  functions of the step), and contributes the rows of its own devices.
  """
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: jax.device_put(x, sharding), batch)

  def _put(x):
    x = np.asarray(x)
    rows = x.shape[0] // jax.process_count()
    local = x[jax.process_index() * rows:(jax.process_index() + 1) * rows]
    return jax.make_array_from_process_local_data(sharding, local, x.shape)
  return jax.tree.map(_put, batch)


def to_host(tree):
  """Fetches a pytree of (possibly multi-host) global arrays as numpy."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)
