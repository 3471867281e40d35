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


def test_computed_once_is_exact():
  """An identity product returns x bit for bit (finite, normal x and zeros;
  subnormals may flush to zero, which cos and sin of float32 angles never
  are)."""
  rs = np.random.RandomState(2)
  x = rs.randn(3, 5, 1, 8).astype(np.float32) * np.float32(1e3)
  x[0, 0, 0, :3] = [0.0, -1.2e-38, -7.5e37]
  out = np.asarray(jax.jit(matmul.computed_once)(x))
  assert out.shape == x.shape and out.dtype == x.dtype
  np.testing.assert_array_equal(out, x)


def test_computed_once_is_a_fusion_boundary():
  """cos(a) read by several elementwise consumers is evaluated once.

  Without the boundary XLA's CPU backend fuses the cosine into each consumer
  (here 3), which is what made the RoPE table cost 6-10 % of a small
  model's training step.
  """
  a = jnp.linspace(0.0, 3.0, 4 * 6 * 8).reshape(4, 6, 8)
  x = jnp.ones((4, 6, 3, 8))

  def consumers(a, x, once):
    c = jnp.cos(a)
    c = matmul.computed_once(c) if once else c
    c = c[:, :, None, :]
    return x * c + 1.0, x / (c + 2.0), x - c

  def count(once):
    text = jax.jit(consumers, static_argnums=2).lower(a, x, once).compile()
    return text.as_text().count("cosine(")

  if jax.default_backend() == "cpu":
    assert count(True) == 1
  for plain, once in zip(consumers(a, x, False), consumers(a, x, True)):
    np.testing.assert_array_equal(plain, once)
