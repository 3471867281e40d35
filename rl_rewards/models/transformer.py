"""Flax Linen modules of the decoder.

These modules are an implementation detail of `rl_rewards.models.model`,
whose pure functions (`init_params`, `apply`, ...) are the public interface.

Architecture (matches Hugging Face `Qwen2ForCausalLM`, `Qwen3ForCausalLM`,
`LlamaForCausalLM`, `MistralForCausalLM` and `Gemma3ForCausalLM`; every
difference between them is a `ModelConfig` field, named in brackets):

  h_0 = E[tokens] * embed_scale                                [embed_scale]
  pre:      a_l = h_l + Attn_l(N(h_l))
            h_{l+1} = a_l + MLP(N(a_l))
  sandwich: a_l = h_l + N(Attn_l(N(h_l)))                   [norm_placement]
            h_{l+1} = a_l + N(MLP(N(a_l)))
  MLP(x) = W_down(act(W_gate x) * (W_up x)),  act silu or gelu_tanh
                                                            [mlp_activation]
  out = head(N(h_L))

with N(x) = x * rsqrt(mean(x^2) + eps) * (offset + w) computed in float32
[rms_scale_offset] (each N has its own w). Attn_l is grouped-query attention:
q, k, v projections [attention_bias], per-head N of q and k [qk_norm], RoPE in
the "rotate_half" convention (the two halves of each head are the real and
imaginary parts) with the layer's inverse frequencies [rope_theta,
rope_scaling; local_rope_theta for sliding layers], the scale 1/sqrt(Dh) or
query_pre_attn_scalar^-1/2, and the mask of the layer's type: causal + padding,
and for "sliding" layers also t − s < sliding_window [layer_types]. The masks
are built by `model.py`; the RoPE tables (cos, sin) once per layer type by
the `Decoder`.

Shapes: tokens [B, T]; activations [B, T, D]; queries [B, T, H, Dh]; keys
and values [B, S, KVH, Dh] as attention reads them, where S is the number of
key slots (T without a cache). Attention takes a boolean mask (causal by
slot, padding, cache validity) and runs as batched matmuls over [B, KVH] on
a CPU, through `jax.nn.dot_product_attention` elsewhere (`attention`). A KV
cache stores keys and values head-major, [B, KVH, S, Dh] (stacked to
[L, B, KVH, S, Dh] for scanned layers), and hands attention the
[B, S, KVH, Dh] view: XLA folds that axis swap into the
attention matmuls, whose batch axes (B, KVH) are then leading in memory, so a
decoding step reads the cache in place. (Stored [B, S, KVH, Dh], XLA's CPU
backend copies the whole cache into that order twice per layer and step.)

With `cfg.scan_layers` the L blocks are one `nn.scan` over a `ScanBlock`
whose parameters are stacked on a leading axis (logical name `layers`); the
scan carries each layer's index and whether it slides, and a layer picks its
mask and RoPE tables by that flag. Otherwise they are L separate `Block`s
`layers_{i}`, each given its own layer type's mask and tables. `cfg.remat`
wraps the block in `nn.remat` (`remat_block`).
Every parameter carries logical axis names from `rl_rewards.sharding.axes`.
"""

import math
from typing import Dict, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards.models import config as config_lib
from rl_rewards.models import matmul
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


def yarn_attention_factor(factor: float, mscale: Optional[float] = None,
                          mscale_all_dim: Optional[float] = None) -> float:
  """YaRN's default cos/sin scale, as transformers' `_compute_yarn_parameters`.

  m(s, a) = 1 if s <= 1 else 0.1 · a · ln(s) + 1; the factor is
  m(factor, mscale) / m(factor, mscale_all_dim) when both mscale and
  mscale_all_dim are given (and non-zero), else m(factor, 1).
  """
  def get_mscale(scale, m=1.0):
    if scale <= 1:
      return 1.0
    return 0.1 * m * math.log(scale) + 1.0
  if mscale and mscale_all_dim:
    return float(get_mscale(factor, mscale) /
                 get_mscale(factor, mscale_all_dim))
  return get_mscale(factor)


def rope_frequencies(head_dim: int, theta: float,
                     scaling: Optional[config_lib.RopeScaling] = None
                     ) -> Tuple[np.ndarray, float]:
  """RoPE inverse frequencies [Dh/2] (float32) and the cos/sin scale.

  Plain RoPE: f_i = 1 / theta^(2i / Dh). With `scaling` (see
  `config.RopeScaling` for the three rules), computed in float32 in the
  order transformers' `ROPE_INIT_FUNCTIONS` use, so the frequencies agree
  with its to the last bit or two.

  Args:
    head_dim: Dh (even).
    theta: RoPE base.
    scaling: None or a `RopeScaling`.

  Returns:
    (inv_freq [Dh/2] float32, attention_factor): cos and sin are multiplied
    by attention_factor (1 except for yarn).
  """
  inv_freq = rope_inverse_frequencies(head_dim, theta)
  if scaling is None:
    return inv_freq, 1.0
  f32 = np.float32
  if scaling.rope_type == "linear":
    return (inv_freq / f32(scaling.factor)).astype(np.float32), 1.0
  if scaling.rope_type == "llama3":
    factor = f32(scaling.factor)
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = (f32(2 * math.pi) / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = ((f32(old_context) / wavelen - f32(low)) /
              f32(high - low)).astype(np.float32)
    smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
  # yarn
  dim, base, factor = head_dim, theta, scaling.factor
  original = scaling.original_max_position_embeddings

  def correction_dim(rotations):
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (
        2 * math.log(base))
  low = correction_dim(scaling.beta_fast)
  high = correction_dim(scaling.beta_slow)
  if scaling.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # As transformers: avoids a division by zero.
  pos_freqs = (f32(base) ** (np.arange(0, dim, 2, dtype=np.float32) /
                             f32(dim))).astype(np.float32)
  extrapolation = (f32(1) / pos_freqs).astype(np.float32)
  interpolation = (f32(1) / (f32(factor) * pos_freqs)).astype(np.float32)
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - f32(low)) /
                 f32(high - low), 0, 1).astype(np.float32)
  extrapolation_factor = f32(1) - ramp
  inv_freq = (interpolation * (f32(1) - extrapolation_factor) +
              extrapolation * extrapolation_factor)
  return inv_freq.astype(np.float32), float(scaling.attention_factor)


class RopeTable(NamedTuple):
  """cos and sin of every position's RoPE angles, [B, T, 1, Dh] (act dtype).

  cos = cos(p · [f, f]) · a, sin = sin(p · [f, f]) · a for positions p,
  inverse frequencies f [Dh/2] and attention factor a (`rope_frequencies`).
  """
  cos: Array
  sin: Array


def rope_table(positions: Array, head_dim: int, theta: float,
               scaling: Optional[config_lib.RopeScaling],
               dtype) -> RopeTable:
  """The `RopeTable` of positions [B, T]; angles computed in float32."""
  inv_freq, attention_factor = rope_frequencies(head_dim, theta, scaling)
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  if attention_factor != 1.0:
    cos, sin = cos * attention_factor, sin * attention_factor
  if jax.default_backend() == "cpu":
    # Evaluated once, not in each query and key RoPE fusion of every layer,
    # forward and backward, that reads it (`matmul.computed_once`).
    cos, sin = matmul.computed_once(cos), matmul.computed_once(sin)
  return RopeTable(cos=cos.astype(dtype), sin=sin.astype(dtype))


def apply_rope(x: Array, table: RopeTable) -> Array:
  """Rotary position embedding, Hugging Face "rotate_half" convention.

  x' = x * cos + rotate_half(x) * sin, with rotate_half([x1, x2]) =
  [-x2, x1] (x1, x2 the two halves of Dh).

  Args:
    x: [B, T, N, Dh] queries or keys.
    table: the `RopeTable` of the tokens' positions ([B, T, 1, Dh]).

  Returns:
    [B, T, N, Dh], same dtype as x.
  """
  cos, sin = table.cos.astype(x.dtype), table.sin.astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2, -1) + eps) * (offset + scale), in float32.

  Without an offset the normalised x is cast to the activation dtype before
  the multiplication (Llama / Qwen); with one (Gemma) the product is taken in
  float32 and then cast.
  """
  eps: float
  dtype: jnp.dtype
  offset: float = 0.0

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale", _partitioned("scale", (axes.NORM,)),
        (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(
        jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    if self.offset:
      return (normed * (self.offset + scale)).astype(self.dtype)
    # HF casts back to the input dtype before multiplying by the weight.
    return normed.astype(self.dtype) * scale.astype(self.dtype)


def _norm(cfg, name=None):
  return RMSNorm(cfg.rms_norm_eps, jnp.dtype(cfg.dtype),
                 offset=cfg.rms_scale_offset, name=name)


class LayerContext(NamedTuple):
  """What a block of one layer type reads besides its input.

  Attributes:
    allowed: [B, T, S] bool, True where query t may attend to key slot s.
    rope: the `RopeTable` of the tokens' positions for this layer type.
  """
  allowed: Array
  rope: RopeTable


# Score of a disallowed key slot: jax.nn.dot_product_attention's, so the two
# attention paths agree also on a query with no allowed key.
_MASKED_SCORE = -0.7 * float(np.finfo(np.float32).max)
# `head_major_attention` streams the cache (multiply-and-sum instead of a
# matmul) when a key head has at most this many query rows (G·T) and the
# cache at least this many slots: measured 1.6-1.8x faster for decoding steps
# at 96-280 slots, slower at 56 (docs/performance.md).
_STREAMED_QUERY_ROWS = 4
_STREAMED_MIN_SLOTS = 64


def attention(q: Array, k: Array, v: Array, allowed: Array,
              scale: Optional[float] = None) -> Array:
  """Masked grouped-query attention.

  out[b, t, n] = sum_s w[b, n, t, s] v[b, s, n // G],
  w[b, n, t, :] = softmax_s(where(allowed[b, t, s],
                                  c · q[b, t, n] . k[b, s, n // G], -big)),

  with G = H / KVH query heads per key/value head (Hugging Face `repeat_kv`
  order; K and V are not repeated). Scores and softmax are float32, the
  products take the inputs' dtype. A query with no allowed key (a padding
  token) gets equal weights over all S slots, so its output and gradients
  stay finite (they are never used).

  The implementation is chosen per backend. On a CPU, `head_major_attention`
  (batched matmuls over [B, KVH] with the G query heads of a key head stacked
  on the query axis): alone, its forward and backward ran 1.3-2.1x faster
  than the XLA path of `jax.nn.dot_product_attention`, inside a whole
  training step as fast (within 3%), and with its streamed products for
  decoding steps the sampler ran 1.17-1.25x faster (docs/performance.md).
  Elsewhere
  `jax.nn.dot_product_attention`: its XLA path, and on a GPU with bfloat16 or
  float16 inputs cuDNN's fused kernel asked for by name (JAX's default is
  its XLA path on every backend as of jax 0.10), falling back to the XLA
  path when cuDNN refuses the shapes or mask.

  Args:
    q: [B, T, H, Dh] queries.
    k: [B, S, KVH, Dh] keys, the dtype of q.
    v: [B, S, KVH, Dh] values, the dtype of q.
    allowed: [B, T, S] bool, True where query t may attend to key slot s.
    scale: c; None means 1 / sqrt(Dh).

  Returns:
    [B, T, H, Dh], the dtype of q.
  """
  backend = jax.default_backend()
  if backend == "cpu":
    return head_major_attention(q, k, v, allowed, scale)
  mask = allowed[:, None]
  if backend == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16):
    try:
      return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                          implementation="cudnn")
    except (ValueError, NotImplementedError, TypeError, RuntimeError):
      pass
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                      implementation=None)


def head_major_attention(q: Array, k: Array, v: Array, allowed: Array,
                         scale: Optional[float] = None) -> Array:
  """`attention` as two batched matmuls with the batch axes leading.

  With q[b, t, (j, g)] the g-th query head of key head j, the queries are
  laid out [B, KVH, G·T, Dh] and the keys and values [B, KVH, S, Dh] (a
  view of the head-major KV cache, so no copy when decoding):

    scores[b, j, (g, t), s] = c · q[b, t, (j, g)] . k[b, s, j]    [B, KVH, G·T, S]
    out[b, j, (g, t)] = Σ_s softmax_s(masked scores) v[b, s, j]  [B, KVH, G·T, Dh]

  and the output goes back to [B, T, H, Dh]. Same arguments and result as
  `attention`; the masked score is the one `jax.nn.dot_product_attention`
  uses, so both treat a query with no allowed key alike.
  """
  batch, length, heads, head_dim = q.shape
  slots, kv_heads = k.shape[1], k.shape[2]
  groups = heads // kv_heads
  scale = head_dim ** -0.5 if scale is None else scale
  queries = q.reshape(batch, length, kv_heads, groups, head_dim)
  queries = queries.transpose(0, 2, 3, 1, 4).reshape(
      batch, kv_heads, groups * length, head_dim)
  keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  # A decoding step (G·T query rows per key head, a long cache): the products
  # as broadcast multiply-and-sum, which streams the cache once; XLA's CPU
  # matmul with so few rows reads it at a fraction of the memory bandwidth.
  stream = groups * length <= _STREAMED_QUERY_ROWS and slots >= _STREAMED_MIN_SLOTS
  if stream:
    scores = jnp.sum(queries[:, :, :, None, :] * keys[:, :, None, :, :],
                     axis=-1, dtype=jnp.float32) * scale
  else:
    scores = jnp.einsum("bjqd,bjsd->bjqs", queries, keys,
                        preferred_element_type=jnp.float32) * scale
  mask = jnp.broadcast_to(allowed[:, None, None],
                          (batch, 1, groups, length, slots))
  scores = jnp.where(mask.reshape(batch, 1, groups * length, slots), scores,
                     _MASKED_SCORE)
  weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if stream:
    out = jnp.sum(weights[..., None] * values[:, :, None], axis=-2)
  else:
    out = jnp.einsum("bjqs,bjsd->bjqd", weights, values)
  out = out.reshape(batch, kv_heads, groups, length, head_dim)
  return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)


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
  def __call__(self, x, context: LayerContext, kv_cache, cache_index,
               layer=None):
    """Attention of the new tokens over all allowed key slots.

    Args:
      x: [B, T, D] normalised activations.
      context: this layer's mask ([B, T, S]) and RoPE table.
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
      y = matmul.dense(x, kernel.astype(dtype))
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
    if cfg.qk_norm:  # Per head, over Dh, before RoPE.
      q = _norm(cfg, "q_norm")(q)
      k = _norm(cfg, "k_norm")(k)
    q = _constrain(apply_rope(q, context.rope),
                   axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, None)
    k = _constrain(apply_rope(k, context.rope),
                   axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_KV_HEADS, None)
    v = _constrain(v, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_KV_HEADS, None)
    if kv_cache is not None:
      k, v, kv_cache = write_kv(kv_cache, k, v, cache_index, layer)
    scale = (None if cfg.query_pre_attn_scalar is None
             else cfg.query_pre_attn_scalar ** -0.5)
    out = attention(q, k.astype(dtype), v.astype(dtype), context.allowed,
                    scale)
    out = _constrain(out, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS,
                     None)

    o_kernel = self.param(
        "o_kernel",
        _partitioned("o_kernel", (axes.HEADS, axes.HEAD_DIM, axes.EMBED)),
        (h, dh, d), jnp.float32)
    out = matmul.dense(out.reshape(*out.shape[:-2], h * dh),
                o_kernel.astype(dtype).reshape(h * dh, d))
    return out, kv_cache


class MLP(nn.Module):
  """Gated MLP: down(act(gate(x)) * up(x)), act silu (SwiGLU) or gelu_tanh."""
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
    if cfg.mlp_activation == "gelu_tanh":
      activation = lambda y: jax.nn.gelu(y, approximate=True)
    else:
      activation = jax.nn.silu
    hidden = (activation(matmul.dense(x, gate.astype(dtype))) *
              matmul.dense(x, up.astype(dtype)))
    hidden = _constrain(hidden, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_MLP)
    return matmul.dense(hidden, down.astype(dtype))


class Block(nn.Module):
  """Decoder block: attention and MLP, each with a residual.

  "pre": x + f(norm(x)); "sandwich" (`cfg.norm_placement`): x +
  norm(f(norm(x))). The norm before the MLP is `post_attention_norm` in the
  "pre" placement (Hugging Face's `post_attention_layernorm`) and
  `pre_feedforward_norm` in the sandwich, where `post_attention_norm` and
  `post_feedforward_norm` normalise the attention and MLP outputs.
  """
  cfg: config_lib.ModelConfig

  def setup(self):
    cfg = self.cfg
    self.input_norm = _norm(cfg)
    self.attention = Attention(cfg)
    self.post_attention_norm = _norm(cfg)
    if cfg.norm_placement == "sandwich":
      self.pre_feedforward_norm = _norm(cfg)
      self.post_feedforward_norm = _norm(cfg)
    self.mlp = MLP(cfg)

  def __call__(self, x, context: LayerContext, kv_cache, cache_index,
               layer=None):
    """[B, T, D] -> ([B, T, D], updated kv_cache); arguments as `Attention`."""
    attn_out, kv_cache = self.attention(
        self.input_norm(x), context, kv_cache, cache_index, layer)
    if self.cfg.norm_placement == "sandwich":
      x = x + self.post_attention_norm(attn_out)
      x = x + self.post_feedforward_norm(
          self.mlp(self.pre_feedforward_norm(x)))
    else:
      x = x + attn_out
      x = x + self.mlp(self.post_attention_norm(x))
    x = _constrain(x, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
    return x, kv_cache


def select_context(contexts: Dict[str, LayerContext], sliding) -> LayerContext:
  """The context of a layer: `contexts["sliding"]` where `sliding` (a traced
  bool scalar), else `contexts["full"]`; the only one when there is one."""
  if len(contexts) == 1:
    return next(iter(contexts.values()))
  return jax.tree.map(lambda s, f: jnp.where(sliding, s, f),
                      contexts["sliding"], contexts["full"])


class ScanBlock(Block):
  """A `Block` with the `nn.scan` calling convention.

  (carry, (layer, sliding), *broadcast) -> (carry, None), carry =
  (x [B, T, D], kv_cache None or stacked (k, v) [L, B, KVH, S, Dh]); `layer`
  is the scanned int32 block index and `sliding` the scanned bool flag of
  its layer type, which picks its `LayerContext` from `contexts` (a dict
  layer type -> `LayerContext`).
  """

  def __call__(self, carry, scanned, contexts, cache_index):
    x, kv_cache = carry
    layer, sliding = scanned
    x, kv_cache = super().__call__(x, select_context(contexts, sliding),
                                   kv_cache, cache_index, layer)
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
    self.embedding = self.param(
        "embed", _partitioned("embed", (axes.VOCAB, axes.EMBED)),
        (cfg.vocab_size, cfg.hidden_size), jnp.float32)
    if cfg.scan_layers:
      # One scanned block; its parameters carry a leading [L] axis.
      scanned = nn.scan(
          remat_block(ScanBlock, cfg, prevent_cse=False),
          variable_axes={"params": 0}, split_rngs={"params": True},
          in_axes=(0, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: axes.LAYERS})
      self.layers = scanned(cfg)
    else:
      block_cls = remat_block(Block, cfg, prevent_cse=True)
      self.blocks = [block_cls(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_layers)]
    self.final_norm = _norm(cfg, name="final_norm")
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

    `allowed` is a dict layer type -> [B, T, S] bool mask (which key slots
    each token may attend to in a layer of that type), with an entry for
    every type in `cfg.attention_kinds` (`model.attention_masks`).
    `positions` [B, T] are the RoPE position ids. `cache` is None or (k, v):
    per-layer tuples of [B, KVH, S, Dh] arrays, or with `cfg.scan_layers`
    stacked [L, B, KVH, S, Dh] arrays.
    """
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    contexts = {}
    for kind in cfg.attention_kinds:
      theta, scaling = cfg.rope_for(kind)
      contexts[kind] = LayerContext(
          allowed=allowed[kind],
          rope=rope_table(positions, cfg.head_dim, theta, scaling, dtype))
    # The table is gathered over the fsdp axis before the lookup (as every
    # other weight is at its use), so the lookup is local to each batch
    # shard instead of a gather of all B·T tokens per hidden-dim shard.
    table = _constrain(self.embedding, axes.VOCAB, None)
    x = jnp.take(table, tokens, axis=0).astype(dtype)
    if cfg.embed_scale != 1.0:
      # Gemma rounds sqrt(D) to the activation dtype first.
      x = x * jnp.asarray(cfg.embed_scale, jnp.float32).astype(dtype)
    x = _constrain(x, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
    if cfg.scan_layers:
      kv_cache = None if cache is None else tuple(cache)
      sliding = jnp.asarray([kind == "sliding" for kind in cfg.layer_kinds])
      (x, new_cache), _ = self.layers(
          (x, kv_cache),
          (jnp.arange(cfg.num_layers, dtype=jnp.int32), sliding),
          contexts, cache_index)
      return self.final_norm(x), new_cache
    new_cache = []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else (cache[0][i], cache[1][i])
      x, layer_new = block(x, contexts[cfg.layer_kinds[i]], layer_cache,
                           cache_index)
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
        out = matmul.dense(x, self.embedding.astype(dtype).T)
      else:
        out = matmul.dense(x, self.lm_head.astype(dtype))
      out = _constrain(out, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_VOCAB)
      return out.astype(jnp.float32)
    if head == "score":
      out = matmul.dense(x, self.score_kernel.astype(dtype))
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
