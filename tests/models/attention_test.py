"""The fused attention against a naive masked softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards.models import transformer

B, T, S, DH = 3, 5, 7, 8


def _inputs(num_heads, num_kv_heads, seed=0):
  rs = np.random.RandomState(seed)
  q = rs.randn(B, T, num_heads, DH).astype(np.float32)
  k = rs.randn(B, S, num_kv_heads, DH).astype(np.float32)
  v = rs.randn(B, S, num_kv_heads, DH).astype(np.float32)
  # Queries are the last T of S slots: causal by slot, with left padding of
  # 0, 1 and 3 slots in the three rows; query 0 of row 2 sits on a padding
  # slot and sees no valid key, like every padding query of a left-padded
  # batch.
  query_slot = np.arange(S - T, S)
  valid = np.arange(S)[None, :] >= np.array([[0], [1], [3]])
  allowed = ((np.arange(S)[None, None, :] <= query_slot[None, :, None]) &
             valid[:, None, :])
  assert not allowed[2, 0].any() and allowed.any(-1).sum() == B * T - 1
  return q, k, v, allowed


def _reference(q, k, v, allowed):
  """Per (row, query, head) softmax over the allowed slots, float64."""
  num_heads, num_kv_heads = q.shape[2], k.shape[2]
  groups = num_heads // num_kv_heads
  out = np.zeros(q.shape, np.float64)
  for b in range(B):
    for t in range(T):
      keys = np.nonzero(allowed[b, t])[0]
      if not len(keys):
        continue
      for n in range(num_heads):
        kv = n // groups  # Hugging Face repeat_kv order.
        scores = k[b, keys, kv].astype(np.float64) @ q[b, t, n] / np.sqrt(DH)
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        out[b, t, n] = weights @ v[b, keys, kv]
  return out


def _naive_jnp(q, k, v, allowed):
  """Repeat K/V to H heads, einsum, explicit mask, float32 softmax."""
  groups = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  scores = jnp.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(DH)
  scores = jnp.where(allowed[:, None], scores, -1e9)
  return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(scores, -1), v)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (4, 1), (2, 2)])
def test_matches_reference(num_heads, num_kv_heads):
  q, k, v, allowed = _inputs(num_heads, num_kv_heads)
  expected = _reference(q, k, v, allowed)
  has_key = allowed.any(-1)
  for fn in (transformer.attention, jax.jit(transformer.attention)):
    out = np.asarray(fn(q, k, v, allowed))
    assert out.shape == q.shape and out.dtype == np.float32
    np.testing.assert_allclose(out[has_key], expected[has_key], rtol=1e-5,
                               atol=1e-5)
    # The query with no allowed key is finite (equal weights).
    assert np.isfinite(out).all()


def test_gradients_match_naive_and_are_finite():
  q, k, v, allowed = _inputs(4, 2, seed=1)
  has_key = allowed.any(-1)
  w = np.random.RandomState(2).randn(*q.shape).astype(np.float32)
  # The padding query's output does not enter the loss, as in the model.
  w[~has_key] = 0.0

  def loss(fn, q, k, v):
    return jnp.sum(fn(q, k, v, allowed) * w)

  fused = jax.grad(lambda *a: loss(transformer.attention, *a),
                   argnums=(0, 1, 2))(q, k, v)
  naive = jax.grad(lambda *a: loss(_naive_jnp, *a), argnums=(0, 1, 2))(
      q, k, v)
  for a, b in zip(fused, naive):
    assert np.isfinite(np.asarray(a)).all()
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Even a cotangent on the padding query's output gives finite gradients.
  grads = jax.grad(lambda q: jnp.sum(transformer.attention(q, k, v, allowed)))(
      q)
  assert np.isfinite(np.asarray(grads)).all()


def test_bfloat16_inputs():
  q, k, v, allowed = _inputs(4, 2, seed=3)
  expected = _reference(q, k, v, allowed)
  out = transformer.attention(*(jnp.asarray(x, jnp.bfloat16)
                                for x in (q, k, v)), allowed)
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out, np.float32)
  has_key = allowed.any(-1)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out[has_key], expected[has_key], atol=0.05)


def _xla_attention(q, k, v, allowed):
  return jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None])


@pytest.mark.parametrize("length,slots", [(5, 7), (1, 80), (2, 96)])
def test_head_major_equals_dot_product_attention(length, slots):
  """Both of `attention`'s paths, on training shapes and on decoding steps
  over a long cache (the streamed products), padding queries included."""
  rs = np.random.RandomState(slots)
  q = rs.randn(2, length, 4, DH).astype(np.float32)
  k = rs.randn(2, slots, 2, DH).astype(np.float32)
  v = rs.randn(2, slots, 2, DH).astype(np.float32)
  allowed = rs.rand(2, length, slots) > 0.3
  allowed[1, 0] = False  # A query with no allowed key.
  streamed = length * 2 <= transformer._STREAMED_QUERY_ROWS and (
      slots >= transformer._STREAMED_MIN_SLOTS)
  assert streamed == (slots >= 80)
  ours = jax.jit(transformer.head_major_attention)(q, k, v, allowed)
  theirs = _xla_attention(q, k, v, allowed)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  has_key = allowed.any(-1)
  groups = 2
  for b, t, n in zip(*np.nonzero(np.broadcast_to(has_key[..., None],
                                                 (2, length, 4)))):
    keys = np.nonzero(allowed[b, t])[0]
    scores = k[b, keys, n // groups].astype(np.float64) @ q[b, t, n]
    weights = np.exp(scores / np.sqrt(DH) - (scores / np.sqrt(DH)).max())
    np.testing.assert_allclose(
        ours[b, t, n], weights / weights.sum() @ v[b, keys, n // groups],
        rtol=1e-4, atol=1e-5)
  grad = lambda fn: jax.grad(lambda q, k, v: jnp.sum(
      fn(q, k, v, allowed) * has_key[..., None, None]), argnums=(0, 1, 2))(
          q, k, v)
  for a, b in zip(grad(transformer.head_major_attention), grad(_xla_attention)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
