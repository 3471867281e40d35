"""Argument checks shared by the credit-assignment functions.

Shapes are static under `jax.jit`, so every check here runs at trace time and
raises a `ValueError` that names the function, the argument and the problem.
"""

from typing import Sequence

import jax.numpy as jnp
import numpy as np


def as_float(x, name: str, fn: str) -> jnp.ndarray:
  """Returns `x` as a floating array of at least float32 precision."""
  try:
    x = jnp.asarray(x)
  except TypeError as e:
    raise ValueError(f"{fn}: `{name}` is not an array: {e}") from e
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(jnp.float32)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def as_mask(mask, name: str, fn: str) -> jnp.ndarray:
  """Returns `mask` as a boolean array (nonzero entries are valid)."""
  try:
    mask = jnp.asarray(mask)
  except TypeError as e:
    raise ValueError(f"{fn}: `{name}` is not an array: {e}") from e
  return mask if mask.dtype == jnp.bool_ else mask != 0


def as_int(x, name: str, fn: str) -> jnp.ndarray:
  """Returns `x` as an int32 array; raises if it is not an integer array."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise ValueError(
        f"{fn}: `{name}` must be an integer array, got dtype {x.dtype}.")
  return x.astype(jnp.int32)


def check_rank(x, rank: int, name: str, fn: str, what: str = "") -> None:
  if x.ndim != rank:
    raise ValueError(
        f"{fn}: `{name}` must have rank {rank}{' ' + what if what else ''}, "
        f"got shape {tuple(x.shape)}.")


def check_same_shape(arrays: Sequence, names: Sequence[str], fn: str) -> None:
  shapes = [tuple(a.shape) for a in arrays]
  if len(set(shapes)) > 1:
    described = ", ".join(f"`{n}` {s}" for n, s in zip(names, shapes))
    raise ValueError(f"{fn}: shapes must match, got {described}.")


def check_batch(x, batch: int, name: str, fn: str) -> None:
  if x.shape[0] != batch:
    raise ValueError(
        f"{fn}: `{name}` has batch size {x.shape[0]}, expected {batch}.")


def check_group_size(batch: int, group_size, fn: str) -> int:
  """Validates a static group size that must divide the batch."""
  if isinstance(group_size, (bool, np.bool_)) or not isinstance(
      group_size, (int, np.integer)):
    raise ValueError(
        f"{fn}: `group_size` must be a Python int (it fixes array shapes), "
        f"got {group_size!r}.")
  group_size = int(group_size)
  if group_size < 1:
    raise ValueError(f"{fn}: `group_size` must be >= 1, got {group_size}.")
  if batch % group_size:
    raise ValueError(
        f"{fn}: batch size {batch} is not divisible by group_size "
        f"{group_size}; the samples of a prompt must be contiguous and "
        "complete.")
  return group_size


def check_choice(value, choices: Sequence[str], name: str, fn: str) -> str:
  if value not in choices:
    raise ValueError(
        f"{fn}: unknown `{name}` {value!r}; expected one of "
        f"{', '.join(repr(c) for c in choices)}.")
  return value


def check_positive(value, name: str, fn: str) -> None:
  """Checks a hyper-parameter when it is a concrete Python number."""
  if isinstance(value, (int, float, np.number)) and not value > 0:
    raise ValueError(f"{fn}: `{name}` must be > 0, got {value}.")
