"""Dense products of activations and weights, shaped for every backend."""

import jax

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
