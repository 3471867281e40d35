"""The LM head in chunks of positions: log-probs, entropies, argmax matches.

    stats = next_token_stats(hidden, kernel, tokens, mask, chunk_size=256)
    stats.logprobs, stats.entropy, stats.is_argmax      # each [B, T]

For hidden states h [B, T, D] and the head kernel W [D, V], every position t
gets the tempered distribution p_t = softmax(h_t W / τ) and

    log-prob  log p_t[y_t]
    entropy   H_t = −Σ_v p_t[v] log p_t[v],  log p_t = z_t − lse_t
    argmax    1[argmax_v z_t[v] = y_t]

with z_t = h_t W / τ and lse_t = log Σ_v exp z_t[v]. The positions are
processed `chunk_size` at a time (T is padded up to whole chunks, balanced
so the padding is < one position per chunk) by a `jax.lax.map` whose body is
wrapped in `jax.checkpoint`: the forward keeps no logits, and the backward
recomputes one chunk's logits at a time, so neither ever holds more than
[B, chunk, V] logits (f32[64, 832, 151936] would be 30 GiB). A single chunk
(T ≤ chunk_size) runs as one plain block, the same computation as the full
`apply(...)` logits.

The matmul runs in the activation dtype of `hidden` and the logits are cast
to float32, as in the model's own head; the kernel is cast inside the chunk
body, so the gradient of a float32 kernel is accumulated over chunks in
float32 (the price: under FSDP the loop-invariant kernel is gathered in
float32, [D, V] x 4 bytes a device).
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rl_rewards.models import matmul
from rl_rewards.sharding import axes

Array = jax.Array

# Positions per chunk. Large enough that the CPU default (T ≈ 100) is one
# chunk; real runs set `config.model.logits_chunk` (e.g. 256 for V = 152 k).
DEFAULT_CHUNK_SIZE = 512


class TokenStats(NamedTuple):
  """Per-token statistics of the model's tempered next-token distribution.

  Attributes:
    logprobs: [B, T] float32 log p_t[y_t].
    entropy: [B, T] float32 H(p_t).
    is_argmax: [B, T] bool, y_t is the most likely token.
  """
  logprobs: Array
  entropy: Array
  is_argmax: Array


def _chunk_stats(hidden, kernel, targets, temperature, with_stats):
  """Head statistics of one block of positions.

  Args:
    hidden: [B, C, D] hidden states (activation dtype).
    kernel: [D, V] head kernel (any float dtype; cast to `hidden`'s).
    targets: [B, C] int target ids.
    temperature: scalar τ > 0.
    with_stats: also return the entropy and the argmax match.

  Returns:
    A tuple of [B, C] arrays: (log p[y],) or (log p[y], H, argmax == y).
  """
  logits = matmul.dense(hidden, kernel.astype(hidden.dtype)).astype(
      jnp.float32)
  logits = nn.with_logical_constraint(
      logits, (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_VOCAB))
  scaled = logits / temperature
  lse = jax.nn.logsumexp(scaled, axis=-1)
  picked = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
  picked = picked - lse
  if not with_stats:
    return (picked,)
  log_probs = scaled - lse[..., None]
  entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
  is_argmax = jnp.argmax(scaled, axis=-1).astype(targets.dtype) == targets
  return picked, entropy, is_argmax


def chunk_layout(length: int, chunk_size: int):
  """(number of chunks n, chunk length c): n = ⌈T / chunk_size⌉ chunks of
  c = ⌈T / n⌉ ≤ chunk_size positions, so n·c − T < n padded positions."""
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
  num_chunks = -(-length // chunk_size)
  return num_chunks, -(-length // num_chunks)


def chunked_stats(hidden: Array, kernel: Array, targets: Array, *,
                  temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                  with_stats: bool = True):
  """Log-probs (and entropies, argmax matches) of `targets`, chunked along T.

    z_t = h_t W / τ,  log p_t = z_t − lse(z_t);
    out_t = (log p_t[y_t], −Σ_v p_t[v] log p_t[v], 1[argmax z_t = y_t])

  Args:
    hidden: [B, T, D] hidden states.
    kernel: [D, V] head kernel.
    targets: [B, T] int target ids y_t, one per position.
    temperature: τ (a float or a traced scalar).
    chunk_size: most positions per chunk (static).
    with_stats: static; False returns the log-probs only (cheaper).

  Returns:
    `TokenStats` of [B, T] arrays, or the [B, T] float32 log-probs alone
    without `with_stats`.
  """
  batch, length, width = hidden.shape
  if targets.shape != (batch, length):
    raise ValueError(f"targets must be [B, T] = {(batch, length)}, got "
                     f"{targets.shape}.")
  if kernel.ndim != 2 or kernel.shape[0] != width:
    raise ValueError(f"kernel must be [D, V] with D = {width}, got "
                     f"{kernel.shape}.")
  targets = targets.astype(jnp.int32)
  num_chunks, chunk = chunk_layout(length, chunk_size)
  if num_chunks == 1:
    # One chunk holds [B, T, V] either way: nothing to recompute.
    out = _chunk_stats(hidden, kernel, targets, temperature, with_stats)
  else:
    pad = num_chunks * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    xs = (hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1),
          targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1))
    body = jax.checkpoint(
        functools.partial(_chunk_stats, with_stats=with_stats))
    out = jax.lax.map(lambda x: body(x[0], kernel, x[1], temperature), xs)
    out = tuple(o.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
                for o in out)
  return TokenStats(*out) if with_stats else out[0]


def next_token_stats(hidden: Array, kernel: Array, tokens: Array,
                     attention_mask: Array, *, temperature=1.0,
                     chunk_size: int = DEFAULT_CHUNK_SIZE,
                     with_stats: bool = True):
  """Statistics of each token under the prediction made before it.

  Entry t describes softmax(h_{t−1} W / τ) at tokens[t] (the causal LM's
  prediction of token t). Entry 0, entries on padding, and the first real
  token of each row (it has no context) are 0 (False for `is_argmax`).

  Args:
    hidden: [B, T, D] hidden states of `tokens`.
    kernel: [D, V] head kernel.
    tokens: [B, T] int ids.
    attention_mask: [B, T], 1 on real tokens.
    temperature: τ.
    chunk_size: most positions per chunk (static).
    with_stats: static; False returns the [B, T] log-probs alone.

  Returns:
    `TokenStats` of [B, T] arrays aligned with `tokens`, or the log-probs.
  """
  # Position t predicts token t + 1; the last position's target is a dummy.
  targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  out = chunked_stats(hidden, kernel, targets, temperature=temperature,
                      chunk_size=chunk_size, with_stats=with_stats)
  valid = attention_mask.astype(bool)
  has_context = valid[:, 1:] & valid[:, :-1]

  def align(x):
    zero = jnp.zeros((), x.dtype)
    return jnp.pad(jnp.where(has_context, x[:, :-1], zero), ((0, 0), (1, 0)))

  if not with_stats:
    return align(out)
  return TokenStats(*(align(x) for x in out))
