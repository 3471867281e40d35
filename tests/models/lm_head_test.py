"""The chunked LM head equals the full-logits computation, and holds no
[B, T, V] logits in the forward or the backward pass."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.models import lm_head


def _reference_stats(hidden, kernel, targets, temperature):
  """Full [B, T, V] logits in float64 numpy."""
  z = np.asarray(hidden, np.float64) @ np.asarray(kernel, np.float64)
  z = z / temperature
  lse = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  logp = np.take_along_axis(z, targets[..., None], -1)[..., 0] - lse
  probs = np.exp(z - lse[..., None])
  entropy = -np.sum(probs * np.log(probs), -1)
  return logp, entropy, np.argmax(z, -1) == targets


def _inputs(batch=3, length=10, width=8, vocab=13, seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.standard_normal((batch, length, width)).astype(np.float32)
  kernel = rng.standard_normal((width, vocab)).astype(np.float32)
  targets = rng.integers(0, vocab, (batch, length)).astype(np.int32)
  return jnp.asarray(hidden), jnp.asarray(kernel), jnp.asarray(targets)


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 5, 10, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_stats_match_full_logits(chunk_size, temperature):
  # T = 10: chunks of 5 and 10 divide it; 3 and 4 do not (padding).
  hidden, kernel, targets = _inputs()
  out = lm_head.chunked_stats(hidden, kernel, targets,
                              temperature=temperature, chunk_size=chunk_size)
  logp, entropy, is_argmax = _reference_stats(hidden, kernel,
                                              np.asarray(targets),
                                              temperature)
  np.testing.assert_allclose(out.logprobs, logp, atol=1e-5)
  np.testing.assert_allclose(out.entropy, entropy, atol=1e-5)
  np.testing.assert_array_equal(out.is_argmax, is_argmax)
  assert out.logprobs.shape == out.entropy.shape == targets.shape
  only_logp = lm_head.chunked_stats(hidden, kernel, targets,
                                    temperature=temperature,
                                    chunk_size=chunk_size, with_stats=False)
  np.testing.assert_array_equal(only_logp, out.logprobs)


def test_chunk_layout_balances_chunks():
  assert lm_head.chunk_layout(832, 512) == (2, 416)   # no padding
  assert lm_head.chunk_layout(10, 4) == (3, 4)        # 2 padded positions
  assert lm_head.chunk_layout(10, 10) == (1, 10)
  assert lm_head.chunk_layout(7, 100) == (1, 7)
  with pytest.raises(ValueError, match="chunk_size"):
    lm_head.chunk_layout(10, 0)


@pytest.mark.parametrize("chunk_size", [3, 5])
def test_chunked_gradients_match_full_logits(chunk_size):
  hidden, kernel, targets = _inputs()
  weights = jnp.asarray(np.random.default_rng(1).standard_normal(
      targets.shape), jnp.float32)

  def chunked(h, k):
    out = lm_head.chunked_stats(h, k, targets, temperature=0.8,
                                chunk_size=chunk_size)
    return jnp.sum(weights * out.logprobs) + jnp.sum(out.entropy)

  def full(h, k):
    z = (h @ k) / 0.8
    logp = jax.nn.log_softmax(z, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, -1)
    return jnp.sum(weights * picked) + jnp.sum(entropy)

  got = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden, kernel)
  want = jax.grad(full, argnums=(0, 1))(hidden, kernel)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_jit_equals_eager():
  hidden, kernel, targets = _inputs()
  fn = lambda h, k, t: lm_head.chunked_stats(h, k, t, chunk_size=4)
  eager = fn(hidden, kernel, targets)
  jitted = jax.jit(fn)(hidden, kernel, targets)
  for a, b in zip(eager, jitted):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_next_token_alignment_and_padding():
  hidden, kernel, tokens = _inputs(batch=2, length=7)
  mask = np.array([[1, 1, 1, 1, 1, 1, 0],      # right padding
                   [0, 0, 1, 1, 1, 1, 1]], np.int32)  # left padding
  out = lm_head.next_token_stats(hidden, kernel, tokens, jnp.asarray(mask),
                                 chunk_size=3)
  logp, entropy, is_argmax = _reference_stats(
      hidden[:, :-1], kernel, np.asarray(tokens)[:, 1:], 1.0)
  context = mask[:, 1:].astype(bool) & mask[:, :-1].astype(bool)
  np.testing.assert_allclose(out.logprobs[:, 1:],
                             np.where(context, logp, 0), atol=1e-5)
  np.testing.assert_allclose(out.entropy[:, 1:],
                             np.where(context, entropy, 0), atol=1e-5)
  np.testing.assert_array_equal(out.is_argmax[:, 1:], context & is_argmax)
  # Entry 0, padding and the first real token (no context) are zero.
  assert not np.asarray(out.logprobs)[:, 0].any()
  assert out.logprobs[0, 6] == 0 and not np.asarray(out.logprobs)[1, :3].any()


# ------------------------------------------------------- through the model --


VOCAB = 13
CFG = models.preset("test", VOCAB)


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0))


def _tokens(batch=3, length=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  mask[1, :4] = 0       # left padding
  mask[2, 9:] = 0       # right padding
  return tokens, mask


def _model_reference(params, tokens, mask, temperature=1.0):
  logits = models.apply(CFG, params, tokens, attention_mask=mask)[0]
  z = logits[:, :-1] / temperature
  logp = jax.nn.log_softmax(z, axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp) * logp, -1)
  argmax = jnp.argmax(z, -1) == tokens[:, 1:]
  context = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)
  pad = lambda x: jnp.pad(jnp.where(context, x, 0), ((0, 0), (1, 0)))
  return pad(picked), pad(entropy), pad(argmax)


# (T, chunk): chunks of 4 divide T = 12; 11 positions in chunks of at most
# 4 are padded to 12; 512 is one chunk.
@pytest.mark.parametrize("length,chunk_size", [(12, 4), (11, 4), (12, 512)])
def test_token_logprobs_and_stats_match_full_logits(params, length,
                                                    chunk_size):
  tokens, mask = _tokens(length=length)
  for temperature in (1.0, 1.7):
    logp, entropy, argmax = _model_reference(params, tokens, mask,
                                             temperature)
    got = models.token_logprobs(CFG, params, tokens, mask,
                                temperature=temperature,
                                chunk_size=chunk_size)
    np.testing.assert_allclose(got, logp, atol=1e-5)
    stats = models.token_stats(CFG, params, tokens, mask,
                               temperature=temperature,
                               chunk_size=chunk_size)
    np.testing.assert_allclose(stats.logprobs, logp, atol=1e-5)
    np.testing.assert_allclose(stats.entropy, entropy, atol=1e-5)
    np.testing.assert_array_equal(stats.is_argmax, argmax)


def test_token_logprob_gradients_match_full_logits(params):
  # Three chunks of 4 for 11 positions (one padded).
  tokens, mask = _tokens(length=11)
  chunk_size = 4
  weights = np.random.default_rng(2).standard_normal(tokens.shape).astype(
      np.float32)

  def chunked(p):
    return jnp.sum(weights * models.token_logprobs(
        CFG, p, tokens, mask, temperature=0.9, chunk_size=chunk_size))

  def full(p):
    return jnp.sum(weights * _model_reference(p, tokens, mask, 0.9)[0])

  got = jax.jit(jax.grad(chunked))(params)
  want = jax.jit(jax.grad(full))(params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    # Sums of many O(10) terms in another order: 1e-6 of the largest entry.
    scale = max(1.0, float(np.max(np.abs(w))))
    np.testing.assert_allclose(g, w, atol=1e-6 * scale, rtol=1e-5)


# ------------------------------------------------- no [B, T, V] buffers ----


def _avals(jaxpr):
  """Every variable's abstract value in a jaxpr and its sub-jaxprs."""
  for eqn in jaxpr.eqns:
    for var in list(eqn.invars) + list(eqn.outvars):
      if hasattr(var, "aval"):
        yield var.aval
    for value in eqn.params.values():
      values = value if isinstance(value, (tuple, list)) else (value,)
      for sub in values:
        if hasattr(sub, "eqns"):
          yield from _avals(sub)
        elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
          yield from _avals(sub.jaxpr)


def test_value_and_grad_holds_no_full_logits():
  vocab, batch, length, chunk = 1000, 4, 64, 16
  cfg = models.preset("test", vocab)
  params = models.init_params(cfg, jax.random.key(0))  # ~0.1 M parameters
  tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  mask = jax.ShapeDtypeStruct((batch, length), jnp.int32)

  def loss(p, t, m, chunk_size):
    return jnp.sum(models.token_logprobs(cfg, p, t, m,
                                         chunk_size=chunk_size))

  def largest_vocab_buffer(chunk_size):
    """Max over intermediates with a V axis of (elements / V)."""
    fn = jax.value_and_grad(lambda p, t, m: loss(p, t, m, chunk_size))
    jaxpr = jax.make_jaxpr(fn)(params, tokens, mask)
    sizes = [math.prod(a.shape) // vocab for a in _avals(jaxpr.jaxpr)
             if hasattr(a, "shape") and vocab in a.shape]
    return max(sizes)

  # Chunked: nothing bigger than [B, chunk, V] (the [D, V] kernel is smaller).
  assert largest_vocab_buffer(chunk) <= batch * chunk
  # The check has teeth: one chunk of 64 holds [B, T, V] logits.
  assert largest_vocab_buffer(length) >= batch * length

  # XLA's buffers follow: no HLO array with a V axis is bigger than
  # [B, chunk, V], and the temporary memory drops by more than the logits.
  def compiled(chunk_size):
    fn = jax.jit(jax.value_and_grad(
        lambda p, t, m: loss(p, t, m, chunk_size)))
    out = fn.lower(params, tokens, mask).compile()
    shapes = re.findall(r"\[([0-9,]*)\]", out.as_text())
    dims = [[int(d) for d in s.split(",")] for s in shapes if s]
    vocab_buffer = max(math.prod(d) // vocab for d in dims if vocab in d)
    return out.memory_analysis().temp_size_in_bytes, vocab_buffer

  chunked_temp, chunked_buffer = compiled(chunk)
  full_temp, full_buffer = compiled(length)
  assert chunked_buffer <= batch * chunk < full_buffer
  assert full_temp - chunked_temp > batch * length * vocab * 4
