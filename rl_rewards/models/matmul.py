"""Dense products of activations and weights, shaped for every backend."""

import jax
import jax.numpy as jnp

Array = jax.Array


def dense(x: Array, kernel: Array) -> Array:
  """x · W over the last axis of x and the leading axis of W, as one 2-D matmul.

  y[..., o] = Σ_d x[..., d] W[d, o] with x [*lead, D] and W [D, *out]
  (e.g. [D, N, Dh]); returns [*lead, *out]. The leading axes of x ([B, T])
  are merged into one and the output axes of W likewise, so the forward
  product and both products of its gradient are plain [M, K] x [K, N]
  matmuls over contiguous rows. XLA's CPU backend otherwise computes the
  weight gradient of a [B, T, D] activation by transposing a [B, T, F]
  operand inside an elementwise fusion, several times slower than the
  matmul itself. The reshapes are free (row-major bitcasts).
  """
  lead, out = x.shape[:-1], kernel.shape[1:]
  y = x.reshape(-1, x.shape[-1]) @ kernel.reshape(kernel.shape[0], -1)
  return y.reshape(*lead, *out)


def computed_once(x: Array) -> Array:
  """x itself, as a value XLA computes once instead of in every consumer.

  XLA's CPU fusion copies a cheap-looking elementwise producer into each
  fusion that reads it, so `jnp.cos(angles)` feeding the RoPE of queries and
  keys in every layer, forward and backward, was evaluated in each consumer
  (10 cosines in one gradient of the `tiny` model; 3-7 % of its SFT step,
  policy update and log-prob pass; docs/performance.md). A product
  with the identity matrix is a fusion boundary and exact for finite x
  (x_e · 1 + Σ_{d≠e} x_d · 0); `jax.lax.optimization_barrier` is not a
  boundary there, the CPU pipeline removes it before fusing.

  Args:
    x: [..., N] finite values (no inf or NaN: 0 · inf is NaN), normal or
      zero: the CPU matmul flushes subnormals to zero (cos and sin of
      float32 angles are never subnormal).

  Returns:
    An array equal to x, element for element.
  """
  eye = jnp.eye(x.shape[-1], dtype=x.dtype)
  return dense(x, eye)
