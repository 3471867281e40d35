"""Masked statistics: sums, means, variances and whitening of valid entries.

This module is the only home of normalisation. Every function treats `mask`
as a validity mask (nonzero = valid); invalid entries of `x` never reach the
result, even when they hold NaN or garbage (padding of a value head, say).

Batch-level statistics must be global when the batch is split over devices:

* Under `jax.jit` with sharded inputs (`NamedSharding`), the reductions below
  are global automatically; nothing needs to be passed.
* Inside `jax.shard_map`, each device sees only its shard. Pass the mapped
  axis as `axis_name`: sums and counts are then `psum`-ed, so every device
  gets the statistics of the whole batch.

Conventions follow verl's `verl.utils.torch_functional`: whitening uses the
unbiased (Bessel-corrected) variance and `(x - mean) * rsqrt(var + 1e-8)`.
Degenerate inputs never give NaN: the mean of an empty selection is 0, the
variance of fewer than two valid entries is 0 (verl raises there instead).
"""

from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks

Axis = Optional[Union[int, Sequence[int]]]
AxisName = Optional[Union[str, Sequence[str]]]


def _psum(x, axis_name: AxisName):
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _prepare(x, mask, fn):
  x = _checks.as_float(x, "x", fn)
  mask = _checks.as_mask(mask, "mask", fn)
  if mask.shape != x.shape:
    try:
      mask = jnp.broadcast_to(mask, x.shape)
    except ValueError as e:
      raise ValueError(
          f"{fn}: `mask` of shape {tuple(mask.shape)} does not broadcast to "
          f"`x` of shape {tuple(x.shape)}.") from e
  return x, mask


def masked_sum(x, mask, axis: Axis = None, *, keepdims: bool = False,
               axis_name: AxisName = None) -> jnp.ndarray:
  """Sum of the valid entries: Σ_i x_i·m_i (invalid entries count as 0).

  Args:
    x: values, any shape.
    mask: validity mask broadcastable to `x.shape`.
    axis: axes to reduce; None reduces everything.
    keepdims: keep reduced axes with size 1.
    axis_name: `shard_map` axis name(s) to `psum` over, or None.

  Returns:
    The masked sum, `x` reduced over `axis`.
  """
  x, mask = _prepare(x, mask, "masked_sum")
  total = jnp.sum(jnp.where(mask, x, 0), axis=axis, keepdims=keepdims)
  return _psum(total, axis_name)


def masked_count(mask, axis: Axis = None, *, keepdims: bool = False,
                 axis_name: AxisName = None) -> jnp.ndarray:
  """Number of valid entries Σ_i m_i, as float32 (global with `axis_name`)."""
  mask = _checks.as_mask(mask, "mask", "masked_count")
  count = jnp.sum(mask, axis=axis, keepdims=keepdims, dtype=jnp.float32)
  return _psum(count, axis_name)


def _safe_divide(numerator, denominator):
  """numerator / denominator, and 0 where the denominator is 0."""
  safe = jnp.where(denominator > 0, denominator, 1)
  return jnp.where(denominator > 0, numerator / safe, 0)


def masked_mean(x, mask, axis: Axis = None, *, keepdims: bool = False,
                axis_name: AxisName = None) -> jnp.ndarray:
  """Mean of the valid entries: μ = Σ x·m / Σ m, and 0 when Σ m = 0.

  Args:
    x: values, any shape (e.g. token values [B, T]).
    mask: validity mask broadcastable to `x.shape`.
    axis: axes to reduce; None (default) gives one batch-global scalar.
    keepdims: keep reduced axes with size 1.
    axis_name: `shard_map` axis name(s); sums and counts are `psum`-ed so the
      mean is over the whole (global) batch.

  Returns:
    The masked mean, `x` reduced over `axis`.
  """
  x, mask = _prepare(x, mask, "masked_mean")
  total = _psum(jnp.sum(jnp.where(mask, x, 0), axis=axis, keepdims=keepdims),
                axis_name)
  count = _psum(
      jnp.sum(mask, axis=axis, keepdims=keepdims, dtype=total.dtype),
      axis_name)
  return _safe_divide(total, count)


def masked_var(x, mask, axis: Axis = None, *, unbiased: bool = True,
               keepdims: bool = False,
               axis_name: AxisName = None) -> jnp.ndarray:
  """Variance of the valid entries (two-pass, so it is accurate).

    σ² = Σ m·(x − μ)² / N · (N / (N − 1) if unbiased),   N = Σ m.

  With `unbiased=True` and N ≤ 1 the variance is 0 rather than undefined.

  Args:
    x: values, any shape.
    mask: validity mask broadcastable to `x.shape`.
    axis: axes to reduce; None gives one batch-global scalar.
    unbiased: apply Bessel's correction N/(N − 1) (verl's default).
    keepdims: keep reduced axes with size 1.
    axis_name: `shard_map` axis name(s) to `psum` sums and counts over.

  Returns:
    The masked variance, `x` reduced over `axis`.
  """
  x, mask = _prepare(x, mask, "masked_var")
  count = _psum(jnp.sum(mask, axis=axis, keepdims=True, dtype=x.dtype),
                axis_name)
  mean = _safe_divide(
      _psum(jnp.sum(jnp.where(mask, x, 0), axis=axis, keepdims=True),
            axis_name), count)
  squares = _psum(
      jnp.sum(jnp.where(mask, jnp.square(x - mean), 0), axis=axis,
              keepdims=True), axis_name)
  denominator = count - 1 if unbiased else count
  var = _safe_divide(squares, denominator)
  if not keepdims:
    var = jnp.squeeze(var, axis=axis) if axis is not None else var.reshape(())
  return var


def masked_whiten(x, mask, *, shift_mean: bool = True, unbiased: bool = True,
                  eps: float = 1e-8, axis: Axis = None,
                  axis_name: AxisName = None) -> jnp.ndarray:
  """Normalises valid entries to zero mean and unit variance.

    x̂ = (x − μ)·rsqrt(σ² + eps)   (+ μ again if not shift_mean),

  with μ and σ² the masked mean and (by default unbiased) variance over the
  whole batch, as verl's `masked_whiten`. Unlike verl, invalid entries of the
  result are 0 (verl leaves (x − μ)·rsqrt(σ² + eps) there, which is garbage
  that every caller has to mask).

  Args:
    x: values, e.g. token advantages [B, T].
    mask: validity mask broadcastable to `x.shape`, e.g. response_mask [B, T].
    shift_mean: subtract the mean (True) or add it back after scaling.
    unbiased: use the Bessel-corrected variance.
    eps: added to the variance before the reciprocal square root.
    axis: axes the statistics run over; None = batch-global.
    axis_name: `shard_map` axis name(s); statistics become global over them.

  Returns:
    Whitened values, same shape as `x`, 0 at invalid entries.
  """
  x, mask = _prepare(x, mask, "masked_whiten")
  mean = masked_mean(x, mask, axis=axis, keepdims=True, axis_name=axis_name)
  var = masked_var(x, mask, axis=axis, unbiased=unbiased, keepdims=True,
                   axis_name=axis_name)
  whitened = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    whitened = whitened + mean
  return jnp.where(mask, whitened, 0)
