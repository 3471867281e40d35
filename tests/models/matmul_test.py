"""`matmul.dense`: one 2-D matmul equal to the einsum it replaces."""

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards.models import matmul


def test_dense_equals_einsum_and_its_gradients():
  rs = np.random.RandomState(0)
  x = rs.randn(3, 5, 6).astype(np.float32)
  kernel = rs.randn(6, 4, 2).astype(np.float32)
  out = matmul.dense(x, kernel)
  assert out.shape == (3, 5, 4, 2)
  expected = np.einsum("btd,dnh->btnh", x.astype(np.float64), kernel)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  # Back to [B, T, D] through a [N, Dh, D]-shaped kernel flattened by hand.
  back = matmul.dense(out.reshape(3, 5, 8), kernel.reshape(6, 8).T)
  np.testing.assert_allclose(
      back, np.einsum("btk,dk->btd", out.reshape(3, 5, 8), kernel.reshape(6, 8)),
      rtol=1e-5, atol=1e-5)
  w = rs.randn(3, 5, 4, 2).astype(np.float32)
  ours = jax.grad(lambda x, k: jnp.sum(matmul.dense(x, k) * w), (0, 1))(
      x, kernel)
  ref = jax.grad(lambda x, k: jnp.sum(jnp.einsum("btd,dnh->btnh", x, k) * w),
                 (0, 1))(x, kernel)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_dense_of_a_single_position():
  """A decoding step's [B, 1, D] input and a [D] -> [1] head."""
  rs = np.random.RandomState(1)
  x = rs.randn(4, 1, 6).astype(np.float32)
  kernel = rs.randn(6, 1).astype(np.float32)
  out = matmul.dense(x, kernel)
  assert out.shape == (4, 1, 1)
  np.testing.assert_allclose(out[:, 0, 0], x[:, 0] @ kernel[:, 0], rtol=1e-5)
