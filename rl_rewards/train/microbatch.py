"""Micro-batches of a batch-first pytree, laid out so no data moves.

    micro = split_rows(batch, 4)          # [B, ...] -> [4, B // 4, ...]
    batch = merge_rows(micro)             # and back, in row order
    out = map_rows(fn, batch, 16)         # fn over 16-row micro-batches

Rows are sharded over devices in contiguous blocks (`mesh.batch_sharding`:
device d holds rows [d·B/N, (d+1)·B/N)). Micro-batch j of n takes the rows
{i·n + j : i < B/n}:

    x.reshape(B // n, n, ...).swapaxes(0, 1)  ->  [n, B // n, ...]

so when the micro-batch size B/n is a multiple of the N devices, the
reshape keeps axis B // n split in the same contiguous blocks, every
micro-batch has B/(n·N) rows on every device, and splitting moves no data
(slicing [j] along the new leading axis is local). A contiguous split
(`x.reshape(n, B // n, ...)`) would instead put micro-batch j on only N/n of
the devices. With `group_size` g the unit is a group of g contiguous rows
(the samples of one prompt): micro-batch j takes whole groups {i·n + j},

    x.reshape(B // (n·g), n, g, ...).swapaxes(0, 1).reshape(n, B // n, ...)

which is what group losses (PRIME's DPO loss, pairwise accuracy) need; it
stays local when B/(n·N) is a multiple of g.

Everything here is shape manipulation plus `jax.lax.scan`/`jax.lax.map`;
results are put back in the original row order by `merge_rows`.
"""

import jax
import jax.numpy as jnp


def num_micro_batches(batch_size: int, micro_batch_size: int,
                      group_size: int = 1, *, what: str = "batch") -> int:
  """n = B / micro_batch_size (1 for micro_batch_size 0: no split).

  Raises:
    ValueError: naming `what` when the sizes do not divide.
  """
  if micro_batch_size < 0:
    raise ValueError(f"{what}: micro_batch_size must be >= 0, got "
                     f"{micro_batch_size}.")
  if micro_batch_size == 0 or micro_batch_size >= batch_size:
    if micro_batch_size > batch_size:
      raise ValueError(f"{what}: micro_batch_size {micro_batch_size} exceeds "
                       f"the batch of {batch_size} rows.")
    return 1
  if batch_size % micro_batch_size:
    raise ValueError(f"{what}: micro_batch_size {micro_batch_size} does not "
                     f"divide the batch of {batch_size} rows.")
  if micro_batch_size % group_size:
    raise ValueError(f"{what}: micro_batch_size {micro_batch_size} must be a "
                     f"multiple of the group size {group_size} (micro-batches "
                     "hold whole groups).")
  return batch_size // micro_batch_size


def _rows(tree) -> int:
  sizes = {x.shape[0] for x in jax.tree.leaves(tree)}
  if len(sizes) != 1:
    raise ValueError(f"every array must have the same number of rows, got "
                     f"{sorted(sizes)}.")
  return sizes.pop()


def split_rows(tree, num: int, group_size: int = 1):
  """[B, ...] leaves -> [n, B // n, ...]; micro-batch j = groups {i·n + j}.

  Args:
    tree: pytree of arrays with a common leading row axis B.
    num: number of micro-batches n (B divisible by n·group_size).
    group_size: rows per indivisible group g (contiguous rows).

  Returns:
    The pytree with leaves [n, B // n, ...].
  """
  def split(x):
    rows = x.shape[0]
    if rows % (num * group_size):
      raise ValueError(f"split_rows: {rows} rows are not {num} micro-batches "
                       f"of whole groups of {group_size}.")
    grouped = x.reshape(rows // (num * group_size), num, group_size,
                        *x.shape[1:])
    return grouped.swapaxes(0, 1).reshape(num, rows // num, *x.shape[1:])
  return jax.tree.map(split, tree)


def merge_rows(tree, group_size: int = 1):
  """Inverse of `split_rows`: [n, B // n, ...] -> [B, ...] in row order."""
  def merge(x):
    num, rows = x.shape[0], x.shape[1]
    grouped = x.reshape(num, rows // group_size, group_size, *x.shape[2:])
    return grouped.swapaxes(0, 1).reshape(num * rows, *x.shape[2:])
  return jax.tree.map(merge, tree)


def map_rows(fn, batch, micro_batch_size: int, group_size: int = 1):
  """`fn(batch)` computed `micro_batch_size` rows at a time, in row order.

    map_rows(fn, b, m)[i] == fn(b)[i]  for every row i

  for a row-wise `fn` (each output row depends only on the same input row,
  or on its group of `group_size` rows). The micro-batches run one after the
  other in a `jax.lax.map`, so memory follows the micro-batch, not B. A B
  that is not a multiple of `micro_batch_size` is padded up with copies of
  its last group, whose outputs are dropped.

  Args:
    fn: pytree of [b, ...] arrays -> pytree of [b, ...] arrays.
    batch: pytree of [B, ...] arrays.
    micro_batch_size: rows per call of `fn` (0 or >= B: one call).
    group_size: rows per indivisible group.

  Returns:
    The pytree `fn(batch)` would return, leaves [B, ...].
  """
  rows = _rows(batch)
  if micro_batch_size <= 0 or micro_batch_size >= rows:
    return fn(batch)
  if micro_batch_size % group_size or rows % group_size:
    raise ValueError(f"map_rows: micro_batch_size {micro_batch_size} and "
                     f"the {rows} rows must be whole groups of {group_size}.")
  num = -(-rows // micro_batch_size)
  padded = num * micro_batch_size
  if padded != rows:
    def pad(x):
      last = x[rows - group_size:]
      copies = (padded - rows) // group_size
      return jnp.concatenate([x, jnp.tile(last, (copies,) + (1,) *
                                          (x.ndim - 1))])
    batch = jax.tree.map(pad, batch)
  out = jax.lax.map(fn, split_rows(batch, num, group_size))
  out = merge_rows(out, group_size)
  return jax.tree.map(lambda x: x[:rows], out) if padded != rows else out


def accumulate(fn, batch, num: int, group_size: int = 1):
  """Σ_j fn(micro-batch j) for a pytree-valued `fn`, by `jax.lax.scan`.

  With num == 1, `fn(batch)` itself (no loop). The running sum is carried
  in the dtypes of `fn`'s outputs (float32 for gradients of float32
  parameters).

  Args:
    fn: pytree of [b, ...] arrays -> pytree of arrays (any shapes).
    batch: pytree of [B, ...] arrays.
    num: number of micro-batches (B divisible by num·group_size).
    group_size: rows per indivisible group.

  Returns:
    The summed pytree.
  """
  if num == 1:
    return fn(batch)
  micro = split_rows(batch, num, group_size)
  shapes = jax.eval_shape(fn, jax.tree.map(lambda x: x[0], micro))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def body(total, part):
    return jax.tree.map(jnp.add, total, fn(part)), None

  total, _ = jax.lax.scan(body, zeros, micro)
  return total
