"""Flax Linen modules of the Qwen2/Llama decoder.

These modules are an implementation detail of `rl_rewards.models.model`,
whose pure functions (`init_params`, `apply`, ...) are the public interface.

Architecture (matches Hugging Face `Qwen2ForCausalLM` / `LlamaForCausalLM`):

  h_0 = E[tokens]
  a_l = h_l + Attention(RMSNorm(h_l))             (GQA, RoPE, causal + pad mask)
  h_{l+1} = a_l + W_down(silu(W_gate x) * (W_up x)),   x = RMSNorm(a_l)
  out = head(RMSNorm(h_L))

with RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w computed in float32, the
attention scale 1/sqrt(Dh) and RoPE in the "rotate_half" convention
(the two halves of each head are the real and imaginary parts).

Shapes: tokens [B, T]; activations [B, T, D]; queries [B, T, H, Dh]; keys
and values [B, S, KVH, Dh] as attention reads them, where S is the number of
key slots (T without a cache). Attention goes through
`jax.nn.dot_product_attention` with a boolean mask (causal by slot, padding,
cache validity). A KV cache stores keys and values head-major,
[B, KVH, S, Dh] (stacked to [L, B, KVH, S, Dh] for scanned layers), and hands
attention the [B, S, KVH, Dh] view: XLA folds that axis swap into the
attention matmuls, whose batch axes (B, KVH) are then leading in memory, so a
decoding step reads the cache in place. (Stored [B, S, KVH, Dh], XLA's CPU
backend copies the whole cache into that order twice per layer and step.)

With `cfg.scan_layers` the L blocks are one `nn.scan` over a `ScanBlock`
whose parameters are stacked on a leading axis (logical name `layers`);
otherwise they are L separate `Block`s `layers_{i}`. `cfg.remat` wraps the
block in `nn.remat` (`remat_block`).
Every parameter carries logical axis names from `rl_rewards.sharding.axes`.
"""

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards.models import config as config_lib
from rl_rewards.sharding import axes

Array = jax.Array

# How every parameter is initialised, by leaf name: (kind, number of leading
# fan-in axes). One table serves the Linen initialisers and the host-side
# `initial_value` used by `model.init_params` (which avoids compiling one
# random-number kernel per parameter).
_INIT_RULES = {
    "embed": ("normal", 0),
    "scale": ("ones", 0),
    "q_kernel": ("fan_in", 1), "k_kernel": ("fan_in", 1),
    "v_kernel": ("fan_in", 1), "o_kernel": ("fan_in", 2),
    "gate_kernel": ("fan_in", 1), "up_kernel": ("fan_in", 1),
    "down_kernel": ("fan_in", 1), "lm_head": ("fan_in", 1),
    "score_kernel": ("fan_in", 1),
    "q_bias": ("zeros", 0), "k_bias": ("zeros", 0), "v_bias": ("zeros", 0),
    "score_bias": ("zeros", 0),
}
EMBED_STDDEV = 0.02
# Stddev of a standard normal truncated to [-2, 2].
_TRUNCATED_STDDEV = 0.87962566103423978


def _fan_in_stddev(shape, num_in_axes):
  return (1.0 / np.prod(shape[:num_in_axes])) ** 0.5 / _TRUNCATED_STDDEV


def initializer(name):
  """The jax initialiser of the parameter called `name` (see _INIT_RULES)."""
  kind, num_in_axes = _INIT_RULES[name]
  if kind == "normal":
    return nn.initializers.normal(EMBED_STDDEV)
  if kind == "ones":
    return nn.initializers.ones
  if kind == "zeros":
    return nn.initializers.zeros

  def fan_in_init(key, shape, dtype=jnp.float32):
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype) * (
        _fan_in_stddev(shape, num_in_axes))
  return fan_in_init


def initial_value(name, shape, generator: np.random.Generator) -> np.ndarray:
  """Same distribution as `initializer(name)`, drawn with numpy, float32."""
  kind, num_in_axes = _INIT_RULES[name]
  if kind == "ones":
    return np.ones(shape, np.float32)
  if kind == "zeros":
    return np.zeros(shape, np.float32)
  values = generator.standard_normal(shape, dtype=np.float32)
  if kind == "normal":
    return values * np.float32(EMBED_STDDEV)
  outside = np.abs(values) > 2.0
  while outside.any():
    values[outside] = generator.standard_normal(int(outside.sum()),
                                                dtype=np.float32)
    outside = np.abs(values) > 2.0
  return values * np.float32(_fan_in_stddev(shape, num_in_axes))


def _partitioned(name, logical_axes):
  return nn.with_logical_partitioning(initializer(name), logical_axes)


def _constrain(x, *names):
  return nn.with_logical_constraint(x, names)


def rope_inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """inv_freq[i] = 1 / theta^(2i / Dh), i < Dh/2, in float32 like HF."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)


def apply_rope(x: Array, positions: Array, theta: float) -> Array:
  """Rotary position embedding, Hugging Face "rotate_half" convention.

  x' = x * cos(p * f) + rotate_half(x) * sin(p * f), with f = [inv_freq,
  inv_freq] (length Dh) and rotate_half([x1, x2]) = [-x2, x1].

  Args:
    x: [B, T, N, Dh] queries or keys.
    positions: [B, T] int position ids.
    theta: RoPE base.

  Returns:
    [B, T, N, Dh], same dtype as x. Angles are computed in float32.
  """
  inv_freq = jnp.asarray(rope_inverse_frequencies(x.shape[-1], theta))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos = jnp.cos(angles).astype(x.dtype)
  sin = jnp.sin(angles).astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2, -1) + eps) * scale, computed in float32."""
  eps: float
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale", _partitioned("scale", (axes.NORM,)),
        (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(
        jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    # HF casts back to the input dtype before multiplying by the weight.
    return normed.astype(self.dtype) * scale.astype(self.dtype)


def attention(q: Array, k: Array, v: Array, allowed: Array) -> Array:
  """Masked grouped-query attention through `jax.nn.dot_product_attention`.

  out[b, t, n] = sum_s w[b, n, t, s] v[b, s, n // G],
  w[b, n, t, :] = softmax_s(where(allowed[b, t, s],
                                  q[b, t, n] . k[b, s, n // G] / sqrt(Dh),
                                  -big)),

  with G = H / KVH query heads per key/value head (Hugging Face `repeat_kv`
  order; K and V are not repeated). Scores and softmax are float32, the
  products take the inputs' dtype. JAX's default (`implementation=None`) is
  its XLA path on every backend as of jax 0.10, so on a GPU with bfloat16 or
  float16 inputs cuDNN's fused kernel is asked for by name, falling back to
  the XLA path when cuDNN refuses the shapes or mask. A query with no allowed
  key (a padding token) gets equal weights over all S slots, so its output
  and gradients stay finite (they are never used).

  Args:
    q: [B, T, H, Dh] queries.
    k: [B, S, KVH, Dh] keys, the dtype of q.
    v: [B, S, KVH, Dh] values, the dtype of q.
    allowed: [B, T, S] bool, True where query t may attend to key slot s.

  Returns:
    [B, T, H, Dh], the dtype of q.
  """
  mask = allowed[:, None]
  if jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16,
                                                   jnp.float16):
    # JAX's default is its XLA path on every backend; ask for cuDNN's fused
    # kernel where it applies, and fall back when it refuses the shapes.
    try:
      return jax.nn.dot_product_attention(q, k, v, mask=mask,
                                          implementation="cudnn")
    except (ValueError, NotImplementedError, TypeError, RuntimeError):
      pass
  return jax.nn.dot_product_attention(q, k, v, mask=mask,
                                      implementation=None)


def constrain_kv(x: Array) -> Array:
  """Sharding annotation of cached keys or values.

  [B, KVH, S, Dh] (one layer) or [L, B, KVH, S, Dh] (stacked): the batch
  axis follows `ACT_BATCH` and the key/value heads `ACT_KV_HEADS`. A no-op
  unless logical axis rules and a mesh are active.
  """
  names = (axes.ACT_BATCH, axes.ACT_KV_HEADS, None, None)
  if x.ndim == 5:
    names = (axes.LAYERS,) + names
  return _constrain(x, *names)


def write_kv(kv_cache, k, v, cache_index, layer):
  """Writes new keys/values into a cache and returns what attention reads.

  cache[b, n, s] = k[b, s - cache_index, n] for s in
  [cache_index, cache_index + T), the other slots unchanged; then
  keys[b, s, n] = cache[b, n, s] for all S slots (likewise for values).

  Args:
    kv_cache: (cache_k, cache_v), each [B, KVH, S, Dh] for one layer
      (`layer` None) or [L, B, KVH, S, Dh] for all layers (`layer` the int32
      index of this block; the write is in place in the stacked buffer).
    k: [B, T, KVH, Dh] new keys.
    v: [B, T, KVH, Dh] new values.
    cache_index: int or int32 scalar, first slot of the new tokens.
    layer: None or int32 scalar.

  Returns:
    (keys [B, S, KVH, Dh], values [B, S, KVH, Dh], updated kv_cache).
  """
  cache_k, cache_v = kv_cache
  k = jnp.swapaxes(k, 1, 2).astype(cache_k.dtype)  # [B, KVH, T, Dh]
  v = jnp.swapaxes(v, 1, 2).astype(cache_v.dtype)
  if layer is None:
    start = (0, 0, cache_index, 0)
    cache_k = constrain_kv(jax.lax.dynamic_update_slice(cache_k, k, start))
    cache_v = constrain_kv(jax.lax.dynamic_update_slice(cache_v, v, start))
    keys, values = cache_k, cache_v
  else:
    start = (layer, 0, 0, cache_index, 0)
    cache_k = constrain_kv(
        jax.lax.dynamic_update_slice(cache_k, k[None], start))
    cache_v = constrain_kv(
        jax.lax.dynamic_update_slice(cache_v, v[None], start))
    keys = jax.lax.dynamic_index_in_dim(cache_k, layer, 0, keepdims=False)
    values = jax.lax.dynamic_index_in_dim(cache_v, layer, 0, keepdims=False)
  return (jnp.swapaxes(keys, 1, 2), jnp.swapaxes(values, 1, 2),
          (cache_k, cache_v))


class Attention(nn.Module):
  """Grouped-query self-attention with RoPE and an optional KV cache."""
  cfg: config_lib.ModelConfig

  @nn.compact
  def __call__(self, x, positions, allowed, kv_cache, cache_index,
               layer=None):
    """Attention of the new tokens over all allowed key slots.

    Args:
      x: [B, T, D] normalised activations.
      positions: [B, T] RoPE position ids.
      allowed: [B, T, S] bool, True where query t may attend to key slot s.
      kv_cache: None, or (k, v) as in `write_kv`: the new keys and values
        are written at slots [cache_index, cache_index + T) and attention
        reads all S slots of the cache.
      cache_index: int or int32 scalar, first slot of the new tokens.
      layer: index of this block in a stacked cache (None: per-layer cache).

    Returns:
      ([B, T, D] output, updated kv_cache or None).
    """
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    d, h = cfg.hidden_size, cfg.num_heads
    kvh, dh = cfg.num_kv_heads, cfg.head_dim

    def projection(name, num_heads, head_axis):
      kernel = self.param(
          f"{name}_kernel",
          _partitioned(f"{name}_kernel",
                       (axes.EMBED, head_axis, axes.HEAD_DIM)),
          (d, num_heads, dh), jnp.float32)
      y = jnp.einsum("btd,dnh->btnh", x, kernel.astype(dtype))
      if cfg.attention_bias:
        bias = self.param(
            f"{name}_bias",
            _partitioned(f"{name}_bias", (head_axis, axes.HEAD_DIM)),
            (num_heads, dh), jnp.float32)
        y = y + bias.astype(dtype)
      return y

    q = projection("q", h, axes.HEADS)
    k = projection("k", kvh, axes.KV_HEADS)
    v = projection("v", kvh, axes.KV_HEADS)
    q = _constrain(apply_rope(q, positions, cfg.rope_theta),
                   axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, None)
    k = _constrain(apply_rope(k, positions, cfg.rope_theta),
                   axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_KV_HEADS, None)
    v = _constrain(v, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_KV_HEADS, None)
    if kv_cache is not None:
      k, v, kv_cache = write_kv(kv_cache, k, v, cache_index, layer)
    out = attention(q, k.astype(dtype), v.astype(dtype), allowed)
    out = _constrain(out, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS,
                     None)

    o_kernel = self.param(
        "o_kernel",
        _partitioned("o_kernel", (axes.HEADS, axes.HEAD_DIM, axes.EMBED)),
        (h, dh, d), jnp.float32)
    out = jnp.einsum("bthd,hdD->btD", out, o_kernel.astype(dtype))
    return out, kv_cache


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  cfg: config_lib.ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    d, f = cfg.hidden_size, cfg.intermediate_size
    gate = self.param("gate_kernel",
                      _partitioned("gate_kernel", (axes.EMBED, axes.MLP)),
                      (d, f), jnp.float32)
    up = self.param("up_kernel",
                    _partitioned("up_kernel", (axes.EMBED, axes.MLP)),
                    (d, f), jnp.float32)
    down = self.param("down_kernel",
                      _partitioned("down_kernel", (axes.MLP, axes.EMBED)),
                      (f, d), jnp.float32)
    hidden = (jax.nn.silu(x @ gate.astype(dtype)) * (x @ up.astype(dtype)))
    hidden = _constrain(hidden, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_MLP)
    return hidden @ down.astype(dtype)


class Block(nn.Module):
  """Pre-norm decoder block: attention and MLP, each with a residual."""
  cfg: config_lib.ModelConfig

  def setup(self):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    self.input_norm = RMSNorm(cfg.rms_norm_eps, dtype)
    self.attention = Attention(cfg)
    self.post_attention_norm = RMSNorm(cfg.rms_norm_eps, dtype)
    self.mlp = MLP(cfg)

  def __call__(self, x, positions, allowed, kv_cache, cache_index,
               layer=None):
    """[B, T, D] -> ([B, T, D], updated kv_cache); arguments as `Attention`."""
    attn_out, kv_cache = self.attention(
        self.input_norm(x), positions, allowed, kv_cache, cache_index, layer)
    x = x + attn_out
    x = x + self.mlp(self.post_attention_norm(x))
    x = _constrain(x, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
    return x, kv_cache


class ScanBlock(Block):
  """A `Block` with the `nn.scan` calling convention.

  (carry, layer, *broadcast) -> (carry, None), carry = (x [B, T, D],
  kv_cache None or stacked (k, v) [L, B, KVH, S, Dh]); `layer` is the
  scanned int32 block index.
  """

  def __call__(self, carry, layer, positions, allowed, cache_index):
    x, kv_cache = carry
    x, kv_cache = super().__call__(x, positions, allowed, kv_cache,
                                   cache_index, layer)
    return (x, kv_cache), None


def remat_block(block_cls, cfg: config_lib.ModelConfig, prevent_cse: bool):
  """`block_cls` wrapped in `nn.remat` as `cfg.remat` says.

  "full" saves only the block's inputs; "dots" uses
  `dots_with_no_batch_dims_saveable`, which keeps the outputs of matmuls
  without batch dimensions -- the q/k/v/o projections and the three MLP
  matmuls, where most of a block's FLOPs are -- and recomputes the attention
  score and weighted-value products (batched over B and heads, [B, H, T, S]
  in size, quadratic in T) and the elementwise work. `checkpoint_dots` would
  also keep the [B, H, T, S] scores. Under `nn.scan` pass
  `prevent_cse=False`: the scan already keeps XLA from merging the
  recomputation with the forward pass, and the extra barriers only cost.
  """
  if cfg.remat == "none":
    return block_cls
  policy = (None if cfg.remat == "full" else
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  return nn.remat(block_cls, prevent_cse=prevent_cse, policy=policy)


class Decoder(nn.Module):
  """Token ids -> head outputs.

  Attributes:
    cfg: the model configuration.
    heads: heads whose parameters `init` creates; `__call__` evaluates only
      the requested ones.
  """
  cfg: config_lib.ModelConfig
  heads: Tuple[str, ...] = ("lm",)

  def setup(self):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    self.embedding = self.param(
        "embed", _partitioned("embed", (axes.VOCAB, axes.EMBED)),
        (cfg.vocab_size, cfg.hidden_size), jnp.float32)
    if cfg.scan_layers:
      # One scanned block; its parameters carry a leading [L] axis.
      scanned = nn.scan(
          remat_block(ScanBlock, cfg, prevent_cse=False),
          variable_axes={"params": 0}, split_rngs={"params": True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: axes.LAYERS})
      self.layers = scanned(cfg)
    else:
      block_cls = remat_block(Block, cfg, prevent_cse=True)
      self.blocks = [block_cls(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.rms_norm_eps, dtype, name="final_norm")
    if "lm" in self.heads and not cfg.tie_word_embeddings:
      self.lm_head = self.param(
          "lm_head", _partitioned("lm_head", (axes.EMBED, axes.VOCAB)),
          (cfg.hidden_size, cfg.vocab_size), jnp.float32)
    if "score" in self.heads:
      self.score_kernel = self.param(
          "score_kernel",
          _partitioned("score_kernel", (axes.EMBED, axes.SCALAR)),
          (cfg.hidden_size, 1), jnp.float32)
      self.score_bias = self.param(
          "score_bias", _partitioned("score_bias", (axes.SCALAR,)),
          (1,), jnp.float32)

  def hidden_states(self, tokens, positions, allowed, cache, cache_index):
    """Final-normed hidden states [B, T, D] and the updated cache.

    `allowed` [B, T, S] says which key slots each token may attend to.
    `cache` is None or (k, v): per-layer tuples of [B, KVH, S, Dh] arrays, or
    with `cfg.scan_layers` stacked [L, B, KVH, S, Dh] arrays.
    """
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    # The table is gathered over the fsdp axis before the lookup (as every
    # other weight is at its use), so the lookup is local to each batch
    # shard instead of a gather of all B·T tokens per hidden-dim shard.
    table = _constrain(self.embedding, axes.VOCAB, None)
    x = jnp.take(table, tokens, axis=0).astype(dtype)
    x = _constrain(x, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
    if cfg.scan_layers:
      kv_cache = None if cache is None else tuple(cache)
      (x, new_cache), _ = self.layers(
          (x, kv_cache), jnp.arange(cfg.num_layers, dtype=jnp.int32),
          positions, allowed, cache_index)
      return self.final_norm(x), new_cache
    new_cache = []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else (cache[0][i], cache[1][i])
      x, layer_new = block(x, positions, allowed, layer_cache, cache_index)
      new_cache.append(layer_new)
    if cache is not None:
      new_cache = (tuple(c[0] for c in new_cache),
                   tuple(c[1] for c in new_cache))
    else:
      new_cache = None
    return self.final_norm(x), new_cache

  def head_output(self, x, head):
    """Applies `head` ("lm" -> logits [B, T, V] f32, "score" -> [B, T] f32)."""
    dtype = jnp.dtype(self.cfg.dtype)
    if head == "lm":
      if self.cfg.tie_word_embeddings:
        out = jnp.einsum("btd,vd->btv", x, self.embedding.astype(dtype))
      else:
        out = x @ self.lm_head.astype(dtype)
      out = _constrain(out, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_VOCAB)
      return out.astype(jnp.float32)
    if head == "score":
      out = x @ self.score_kernel.astype(dtype)
      return (out[..., 0] + self.score_bias[0].astype(dtype)).astype(
          jnp.float32)
    raise ValueError(f"Unknown head {head!r}; expected one of "
                     f"{config_lib.HEAD_NAMES}.")

  def __call__(self, tokens, positions, allowed, cache=None, cache_index=0,
               head: Optional[str] = "lm", last_only: bool = False):
    """Head output [B, T, ...] (or [B, 1, ...] for the last token only)."""
    x, new_cache = self.hidden_states(tokens, positions, allowed, cache,
                                      cache_index)
    if last_only:
      x = x[:, -1:]
    return self.head_output(x, head), new_cache

  def init_all_heads(self, tokens, positions, allowed):
    """Touches every head in `self.heads` (used by `init`)."""
    x, _ = self.hidden_states(tokens, positions, allowed, None, 0)
    return [self.head_output(x, head) for head in self.heads]
