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

Several processes (hosts). Start the same command on every host, e.g.

    JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0 \
        python -m experiments.train --config=... --workdir=/shared/run
    JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1 \
        python -m experiments.train --config=... --workdir=/shared/run

(`JAX_PROCESS_ID` differs per host; on Cloud TPU pods and under SLURM JAX
finds all three itself). `experiments/train.py` calls
`maybe_initialize_distributed()` before anything touches a device; the mesh
then spans every process's devices (`config.mesh` sizes count all of them),
and the workdir must be on a file system all hosts share (orbax writes
checkpoints from every process; only process 0 writes metrics.jsonl,
summary.json and config.json). On CPU (tests), set `JAX_PLATFORMS=cpu` and
`XLA_FLAGS=--xla_force_host_platform_device_count=N` per process;
cross-process collectives use gloo (JAX's default
`jax_cpu_collectives_implementation`).

Each process builds only its own rows of a batch: the rows its devices hold
(`process_rows`), placed with `put_local_batch`; it reads back only those
rows of an output (`local_rows`, no all-gather) and combines metrics from
per-process sums and counts (`process_sums`). Each process's devices must
hold one contiguous block of rows of their own, which holds when the
`tensor` axis stays within a host (`process_row_blocks` checks it).
"""

import contextlib
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from rl_rewards import errors
from rl_rewards.sharding import axes

P = jax.sharding.PartitionSpec
NamedSharding = jax.sharding.NamedSharding


def maybe_initialize_distributed():
  """Calls `jax.distributed.initialize()` on a multi-process launch.

  A multi-process launch is recognised by the coordinator address in the
  environment (`JAX_COORDINATOR_ADDRESS`, with `JAX_NUM_PROCESSES` and
  `JAX_PROCESS_ID` unless the cluster tells JAX itself) or by a cluster
  environment JAX detects on its own (Cloud TPU pods, SLURM); single-process
  runs do nothing. Call it before anything touches a device.
  """
  import os  # pylint: disable=g-import-not-at-top
  if jax.distributed.is_initialized():
    return
  env = os.environ
  if not (env.get("JAX_COORDINATOR_ADDRESS") or env.get("SLURM_JOB_ID") or
          env.get("TPU_WORKER_HOSTNAMES")):
    return
  kwargs = {}
  for key, name in (("num_processes", "JAX_NUM_PROCESSES"),
                    ("process_id", "JAX_PROCESS_ID")):
    if env.get(name):
      kwargs[key] = int(env[name])
  jax.distributed.initialize(**kwargs)


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
    raise errors.InputError(
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


def _device_process(device) -> int:
  return device.process_index


def process_row_blocks(global_batch_size: int, mesh: jax.sharding.Mesh, *,
                       device_process=_device_process) -> dict:
  """The rows of a batch each process holds: `{process: (start, stop)}`.

  Rows of a batch-first array are split over `('data', 'fsdp')`
  (`batch_sharding`); a process holds the rows of its addressable devices.
  Each process must hold one contiguous block, disjoint from the other
  processes' blocks (true when the mesh lists each process's devices
  together and the `tensor` axis stays within a process, as `make_mesh`
  does with `jax.devices()`).

  Args:
    global_batch_size: B, rows of the global array (a multiple of the
      mesh's data parallelism).
    mesh: the device mesh.
    device_process: device -> process index (default: the device's own).

  Returns:
    `{process_index: (start, stop)}`; the blocks tile [0, B).

  Raises:
    ValueError: if B does not divide over the mesh, or a process's rows are
      not contiguous, or two processes hold the same rows.
  """
  check_batch_divides(global_batch_size, mesh, "batch rows")
  indices = batch_sharding(mesh).devices_indices_map((global_batch_size,))
  blocks = {}
  for device, index in indices.items():
    start, stop, _ = index[0].indices(global_batch_size)
    blocks.setdefault(device_process(device), set()).add((start, stop))
  out = {}
  for process, held in blocks.items():
    held = sorted(held)
    for (_, stop), (start, _) in zip(held, held[1:]):
      if stop != start:
        raise ValueError(
            f"process {process} holds rows {held} of a batch of "
            f"{global_batch_size}, not one contiguous block; list each "
            "process's devices together in the mesh.")
    out[process] = (held[0][0], held[-1][1])
  spans = sorted(out.values())
  for (_, stop), (start, _) in zip(spans, spans[1:]):
    if start < stop:
      raise ValueError(
          f"several processes hold the same rows of a batch of "
          f"{global_batch_size} ({out}): the mesh {dict(mesh.shape)} "
          "replicates the batch across processes; keep the `tensor` axis "
          "within a process (data x fsdp must cover the processes).")
  return out


def process_rows(global_batch_size: int, mesh: jax.sharding.Mesh) -> slice:
  """The rows `[start, stop)` of a global batch held by this process.

  Inputs of a step (problems, prompts) are a pure function of (step, row),
  so a process builds only these rows (`put_local_batch`), and it reads
  back only these rows of an output (`local_rows`). With `sample(...,
  num_samples=n)` the rows of a process's prompts are exactly
  `process_rows(n * B)`: whole groups of n samples stay on one process.
  """
  start, stop = process_row_blocks(global_batch_size, mesh)[
      jax.process_index()]
  return slice(start, stop)


def put_local_batch(local_batch, mesh: jax.sharding.Mesh,
                    global_batch_size: int):
  """Places this process's rows of a batch as global arrays on the mesh.

  Args:
    local_batch: a pytree of host arrays [R, ...] holding rows
      `process_rows(global_batch_size, mesh)` of the global batch.
    mesh: the device mesh.
    global_batch_size: B, the rows of the global batch.

  Returns:
    The pytree of global [B, ...] arrays, rows split over `('data',
    'fsdp')`; built from each process's own rows, no host holds all of them.
  """
  sharding = batch_sharding(mesh)
  rows = process_rows(global_batch_size, mesh)

  def _put(x):
    x = np.asarray(x)
    if x.shape[0] != rows.stop - rows.start:
      raise ValueError(
          f"put_local_batch: got {x.shape[0]} rows, but this process holds "
          f"rows {rows.start}..{rows.stop - 1} of {global_batch_size}.")
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    return jax.make_array_from_process_local_data(
        sharding, x, (global_batch_size,) + x.shape[1:])
  return jax.tree.map(_put, local_batch)


def put_batch(batch, mesh: jax.sharding.Mesh):
  """Places a pytree of global host arrays on the mesh, rows split over data.

  Every process holds the same global batch and contributes the rows of its
  own devices (`process_rows`). Prefer building only those rows and calling
  `put_local_batch`.
  """
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: jax.device_put(x, sharding), batch)

  def _put(x):
    x = np.asarray(x)
    local = x[process_rows(x.shape[0], mesh)]
    return jax.make_array_from_process_local_data(sharding, local, x.shape)
  return jax.tree.map(_put, batch)


def local_rows(tree, mesh: jax.sharding.Mesh):
  """This process's rows of a pytree of global batch-first arrays, as numpy.

  Reads only the addressable shards (no cross-process transfer): the result
  of a leaf [B, ...] is rows `process_rows(B, mesh)`, in row order. Any
  sharding whose local shards cover those rows works (batch-split or
  replicated).
  """
  def _local(x):
    rows = process_rows(x.shape[0], mesh)
    if x.is_fully_addressable:
      return np.asarray(jax.device_get(x))[rows]
    out = np.empty((rows.stop - rows.start,) + x.shape[1:], x.dtype)
    covered, seen = 0, set()
    for shard in x.addressable_shards:
      ranges = [index.indices(size)[:2]
                for index, size in zip(shard.index, x.shape)]
      if tuple(ranges) in seen:
        continue
      seen.add(tuple(ranges))
      (start, stop), rest = ranges[0], ranges[1:]
      lo, hi = max(start, rows.start), min(stop, rows.stop)
      if lo >= hi:
        continue
      data = np.asarray(shard.data)[lo - start:hi - start]
      target = (slice(lo - rows.start, hi - rows.start),) + tuple(
          slice(a, b) for a, b in rest)
      out[target] = data
      covered += data.size
    if covered != out.size:
      raise ValueError(
          f"local_rows: the addressable shards of an array {x.shape} with "
          f"sharding {x.sharding} do not hold rows {rows.start}.."
          f"{rows.stop - 1}; split its rows with `batch_sharding`.")
    return out
  return jax.tree.map(_local, tree)


def process_sums(sums: Mapping[str, float]) -> dict:
  """Adds up per-process sums and counts over all processes.

  Metrics of rows held by different processes are combined from their sums
  and counts, never from the rows: a float64 vector per process is
  all-gathered (bit-exact, as uint32 words) and summed in process order, so
  every process gets identical totals.

  Args:
    sums: name -> this process's sum (every process passes the same names).

  Returns:
    name -> the sum over processes (float).
  """
  keys = sorted(sums)
  values = np.asarray([float(sums[k]) for k in keys], np.float64)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    words = multihost_utils.process_allgather(values.view(np.uint32))
    values = np.asarray(words, np.uint32).reshape(
        jax.process_count(), -1).view(np.float64).sum(axis=0)
  return {k: float(v) for k, v in zip(keys, values)}


def sync_processes(name: str):
  """Waits until every process reaches this point (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def to_host(tree):
  """Fetches a pytree of (possibly multi-process) global arrays as numpy.

  Every process receives every row (an all-gather); to read only this
  process's rows use `local_rows`.
  """
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)
