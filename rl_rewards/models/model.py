"""The decoder as pure functions of (config, params, arrays).

    params = init_params(cfg, rng, heads=("lm",))
    logits, _ = apply(cfg, params, tokens, attention_mask=mask)
    scores, _ = apply(cfg, params, tokens, attention_mask=mask, head="score")

Token arrays are batch-first [B, T] int32. `attention_mask` is 1 on real
tokens and 0 on padding; padded keys are never attended to. Position ids
default to cumsum(attention_mask) - 1 (clipped at 0), so a left-padded prompt
gets positions relative to its first real token, as in Hugging Face
`generate`. Attention is causal by slot index; in a layer of type "sliding"
(`cfg.layer_types`) the query in slot t also sees only key slots s with
t − s < `cfg.sliding_window` (`attention_masks` builds the masks of every
pass: training, log-probs and the KV-cache decode alike). Slots are
contiguous in every row of a left-padded batch, so this is the distance in
positions too.

With a KV cache (`init_cache`), the T new tokens are written at slots
[cache_index, cache_index + T) and attend to every earlier valid slot; the
updated cache is returned. Parameters are plain nested dicts of float32
arrays; `param_logical_axes` gives the matching logical `PartitionSpec`s.

Two parameter layouts, chosen by `cfg.scan_layers`: one subtree per block,
`params["layers_{i}"]`, or every block parameter stacked on a leading [L]
axis, `params["layers"]` (the blocks then run under one `nn.scan`).
`stack_layers` / `unstack_layers` convert; `init_params` draws the same
values in both layouts.
"""

import concurrent.futures
import functools
import os
import zlib
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards.models import config as config_lib
from rl_rewards.models import lm_head
from rl_rewards.models import transformer

Array = jax.Array
Params = Any

# Key of the stacked block parameters in the scanned layout.
_STACKED = "layers"


class KVCache(NamedTuple):
  """Keys and values of the tokens seen so far.

  Stored head-major, [B, KVH, S, Dh] per layer: attention reads
  `swapaxes(cache.k[i], 1, 2)`, the [B, S, KVH, Dh] layout of
  `jax.nn.dot_product_attention`, and XLA folds the swap into the attention
  matmuls, so a decoding step reads the cache in place (see
  `transformer.write_kv`). With per-layer blocks (`cfg.scan_layers` False)
  `k` and `v` are tuples of L arrays [B, KVH, S, Dh], each updated in place
  by its block; with scanned blocks they are single arrays
  [L, B, KVH, S, Dh] carried through the scan. Either way `cache.k[i]` is
  layer i's keys and `len(cache.k)` is L.

  Attributes:
    k: keys (activation dtype), per-layer tuple or stacked array.
    v: values, the layout of `k`.
    key_mask: [B, S] bool, True on slots that hold a real (non-pad) token.
  """
  k: Union[Tuple[Array, ...], Array]
  v: Union[Tuple[Array, ...], Array]
  key_mask: Array

  @property
  def max_len(self) -> int:
    return self.key_mask.shape[1]

  @property
  def stacked(self) -> bool:
    """True for the [L, B, KVH, S, Dh] layout of scanned blocks."""
    return not isinstance(self.k, (tuple, list))


def _check_heads(heads):
  heads = tuple(heads)
  if not heads:
    raise ValueError("heads must name at least one head.")
  for head in heads:
    if head not in config_lib.HEAD_NAMES:
      raise ValueError(f"Unknown head {head!r} in heads={heads}; expected "
                       f"names from {config_lib.HEAD_NAMES}.")
  if len(set(heads)) != len(heads):
    raise ValueError(f"heads has duplicates: {heads}.")
  return heads


def _module(cfg, heads=("lm",)):
  return transformer.Decoder(cfg, heads=tuple(heads))


def attention_masks(cfg: config_lib.ModelConfig, query_slot: Array,
                    key_slot: Array, key_valid: Array,
                    query_position: Optional[Array] = None,
                    key_position: Optional[Array] = None) -> dict:
  """The attention mask of each layer type in use, by slot index.

  full[b, t, s]    = key_slot[s] <= query_slot[t]  and  key_valid[b, s]
  sliding[b, t, s] = full[b, t, s]  and  query_slot[t] − key_slot[s] < W

  with W = `cfg.sliding_window` (Hugging Face's `sliding_window_overlay`).
  With positions, the window is measured in positions instead,
  query_position[b, t] − key_position[b, s] < W, which differs from the
  slot distance only in rows with empty slots between valid ones.

  Args:
    cfg: the model configuration (`attention_kinds`, `sliding_window`).
    query_slot: [T] int slot of each query token.
    key_slot: [S] int slot of each key.
    key_valid: [B, S] bool, True on keys that hold a real token.
    query_position: optional [B, T] position of each query token.
    key_position: optional [B, S] position of each key (both or neither).

  Returns:
    {layer type: [B, T, S] bool} for every type in `cfg.attention_kinds`.
  """
  distance = query_slot[:, None] - key_slot[None, :]  # [T, S]
  full = (distance >= 0)[None] & key_valid[:, None, :]
  masks = {}
  for kind in cfg.attention_kinds:
    if kind == "sliding" and query_position is not None:
      masks[kind] = full & (
          query_position[:, :, None] - key_position[:, None, :] <
          cfg.sliding_window)
    elif kind == "sliding":
      masks[kind] = full & (distance < cfg.sliding_window)[None]
    else:
      masks[kind] = full
  return masks


def _boxed_init(cfg, heads, rng):
  tokens = jnp.zeros((1, 1), jnp.int32)
  positions = jnp.zeros((1, 1), jnp.int32)
  slot = jnp.zeros((1,), jnp.int32)
  allowed = attention_masks(cfg, slot, slot, jnp.ones((1, 1), bool))
  module = _module(cfg, heads)
  return module.init(rng, tokens, positions, allowed,
                     method=transformer.Decoder.init_all_heads)["params"]


def _abstract_params(cfg, heads):
  """Shapes of the parameters (no computation)."""
  boxed = jax.eval_shape(functools.partial(_boxed_init, cfg, heads),
                         jax.random.key(0))
  # `.value`, not `nn.unbox`: unboxing applies sharding constraints when
  # logical-axis rules are active, and these are shapes, not arrays.
  return jax.tree.map(lambda box: box.value, boxed,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def abstract_params(cfg: config_lib.ModelConfig, *,
                    heads: Sequence[str] = ("lm",)) -> Params:
  """The parameters' shapes and dtypes as `jax.ShapeDtypeStruct`s (nothing
  is computed or allocated): what ahead-of-time compiles and the memory
  planner start from."""
  return _abstract_params(cfg, _check_heads(heads))


def _seed_words(rng) -> np.ndarray:
  if isinstance(rng, jax.core.Tracer):
    raise ValueError("init_params runs on the host; pass a concrete PRNG key, "
                     "not a traced one (call it outside jax.jit).")
  rng = jnp.asarray(rng)
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  return np.asarray(rng, np.uint32).ravel()


def init_params(cfg: config_lib.ModelConfig, rng: Array, *,
                heads: Sequence[str] = ("lm",),
                shardings: Optional[Params] = None) -> Params:
  """Fresh float32 parameters (a plain nested dict).

  The values are drawn on the host with numpy (one generator per parameter,
  seeded from `rng` and the parameter's path, so adding a head leaves the
  other parameters unchanged), which avoids compiling a random-number kernel
  per parameter. Kernels get a truncated normal with variance 1 / fan_in,
  the embedding N(0, 0.02^2), norm scales 1 and biases 0.

  Args:
    cfg: model configuration.
    rng: PRNG key (concrete, not traced).
    heads: which heads to create: "lm" (the policy's token logits; reuses the
      embedding when `cfg.tie_word_embeddings`) and/or "score" (a scalar per
      token, for value models and PRMs).
    shardings: optional pytree of `jax.sharding.Sharding` matching the
      params; each array is placed directly into its sharding.

  Returns:
    The parameter dict: `embed` [V, D], `layers_{i}` (or `layers` with an
    [L] leading axis when `cfg.scan_layers`; the same values either way),
    `final_norm`, and `lm_head` [D, V] / `score_kernel` [D, 1] +
    `score_bias` [1] per head.
  """
  heads = _check_heads(heads)
  seed = _seed_words(rng)
  abstract = _abstract_params(cfg, heads)
  paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  sharding_leaves = (
      [None] * len(paths_and_leaves) if shardings is None
      else treedef.flatten_up_to(shardings))

  def draw(names, shape):
    path_hash = zlib.crc32("/".join(names).encode())
    generator = np.random.default_rng([*seed.tolist(), path_hash])
    return transformer.initial_value(names[-1], shape, generator)

  def draw_leaf(path, leaf):
    names = [entry.key for entry in path]
    if names[0] == _STACKED:
      # Drawn per block under the per-layer names, so that both layouts
      # hold the same values.
      return np.stack([draw([f"layers_{i}", *names[1:]], leaf.shape[1:])
                       for i in range(cfg.num_layers)])
    return draw(names, leaf.shape)

  # Each leaf has its own generator, so drawing them on threads (numpy
  # releases the GIL while filling an array) gives the same values.
  with concurrent.futures.ThreadPoolExecutor(_init_threads()) as pool:
    drawn = pool.map(lambda item: draw_leaf(*item), paths_and_leaves)
    values = [jnp.asarray(value) if sharding is None
              else jax.device_put(value, sharding)
              for value, sharding in zip(drawn, sharding_leaves)]
  return jax.tree.unflatten(treedef, values)


def _init_threads() -> int:
  return max(1, min(16, os.cpu_count() or 1))


def _layer_names(cfg):
  return [f"layers_{i}" for i in range(cfg.num_layers)]


def _stack(arrays):
  if all(isinstance(x, np.ndarray) for x in arrays):
    return np.stack(arrays)  # Host arrays stay on the host.
  return jnp.stack(arrays)


def stack_layers(cfg: config_lib.ModelConfig, params: Params) -> Params:
  """Per-layer parameters -> the scanned layout.

  out["layers"][path][i] = params[f"layers_{i}"][path] for i < L; every
  other entry (embedding, final norm, heads) is passed through. numpy
  leaves stay numpy, others become jax arrays.

  Args:
    cfg: the model configuration (either value of `scan_layers`; only
      `num_layers` is read).
    params: parameters with `layers_0` ... `layers_{L-1}`.

  Returns:
    Parameters with one `layers` subtree of [L, ...] leaves.
  """
  names = _layer_names(cfg)
  missing = [name for name in names if name not in params]
  if _STACKED in params or missing:
    raise ValueError(
        f"stack_layers needs per-layer params layers_0..layers_"
        f"{cfg.num_layers - 1}; got entries {sorted(params)}.")
  out = {k: v for k, v in params.items() if k not in names}
  out[_STACKED] = jax.tree.map(lambda *xs: _stack(xs),
                               *[params[name] for name in names])
  return out


def unstack_layers(cfg: config_lib.ModelConfig, params: Params) -> Params:
  """Scanned parameters -> one `layers_{i}` subtree per block.

  out[f"layers_{i}"][path] = params["layers"][path][i]; the inverse of
  `stack_layers`.

  Args:
    cfg: the model configuration (only `num_layers` is read).
    params: parameters with a `layers` subtree of [L, ...] leaves.

  Returns:
    Parameters with `layers_0` ... `layers_{L-1}`.
  """
  if _STACKED not in params:
    raise ValueError(f"unstack_layers needs stacked params with a "
                     f"'{_STACKED}' entry; got entries {sorted(params)}.")
  for leaf in jax.tree.leaves(params[_STACKED]):
    if leaf.shape[:1] != (cfg.num_layers,):
      raise ValueError(f"stacked params have a leaf of shape {leaf.shape}; "
                       f"expected a leading axis of {cfg.num_layers} layers.")
  out = {k: v for k, v in params.items() if k != _STACKED}
  for i, name in enumerate(_layer_names(cfg)):
    out[name] = jax.tree.map(lambda x, i=i: x[i], params[_STACKED])
  return out


def check_layout(cfg: config_lib.ModelConfig, params: Params) -> None:
  """Raises a clear error when params' block layout differs from
  `cfg.scan_layers` (per-layer `layers_{i}` vs stacked `layers`)."""
  if cfg.scan_layers and "layers_0" in params:
    raise ValueError("cfg.scan_layers is True but params hold per-layer "
                     "entries layers_{i}; convert them with "
                     "stack_layers(cfg, params).")
  if not cfg.scan_layers and _STACKED in params:
    raise ValueError("cfg.scan_layers is False but params hold stacked "
                     "'layers'; convert them with unstack_layers(cfg, params).")


def param_logical_axes(cfg: config_lib.ModelConfig, *,
                       heads: Sequence[str] = ("lm",)) -> Params:
  """The pytree of logical `PartitionSpec`s matching `init_params`' output.

  Each leaf is a `jax.sharding.PartitionSpec` of names from
  `rl_rewards.sharding.axes` (e.g. `PartitionSpec('embed', 'mlp')`, or
  `PartitionSpec('layers', 'embed', 'mlp')` for a stacked block parameter
  when `cfg.scan_layers`); map them to mesh shardings with
  `nn.logical_to_mesh_sharding(specs, mesh, rules)`.
  """
  heads = _check_heads(heads)
  boxed = jax.eval_shape(
      functools.partial(_boxed_init, cfg, heads), jax.random.key(0))
  return nn.get_partition_spec(boxed)


def init_from_backbone(cfg: config_lib.ModelConfig, params: Params,
                       rng: Array, *,
                       heads: Sequence[str] = ("score",)) -> Params:
  """Parameters for a model with `heads` that shares `params`' backbone.

  Used to start a value model or PRM from a policy: the embedding, blocks and
  final norm are copied from `params`, an LM head is kept when `heads` has
  "lm" and `params` has one, and the score head is always freshly
  initialised from `rng`. `params` must be in the layout of `cfg`
  (`cfg.scan_layers`).
  """
  heads = _check_heads(heads)
  check_layout(cfg, params)
  out = dict(init_params(cfg, rng, heads=heads))
  for name, value in params.items():
    is_backbone = name not in ("lm_head", "score_kernel", "score_bias")
    if is_backbone or (name == "lm_head" and "lm" in heads):
      out[name] = value
  return jax.tree.map(jnp.asarray, out)


def init_cache(cfg: config_lib.ModelConfig, batch_size: int,
               max_len: int) -> KVCache:
  """An empty KV cache with `max_len` slots (all slots invalid).

  Keys and values are zeros in the activation dtype: L arrays
  [B, KVH, S, Dh], or one [L, B, KVH, S, Dh] array when `cfg.scan_layers`.
  """
  if batch_size <= 0 or max_len <= 0:
    raise ValueError(f"init_cache needs batch_size > 0 and max_len > 0, got "
                     f"{batch_size} and {max_len}.")
  dtype = jnp.dtype(cfg.dtype)
  shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)

  def zeros(shape):
    return transformer.constrain_kv(jnp.zeros(shape, dtype))
  if cfg.scan_layers:
    k = zeros((cfg.num_layers, *shape))
    v = zeros((cfg.num_layers, *shape))
  else:
    k = tuple(zeros(shape) for _ in range(cfg.num_layers))
    v = tuple(zeros(shape) for _ in range(cfg.num_layers))
  return KVCache(k=k, v=v, key_mask=jnp.zeros((batch_size, max_len), bool))


def _map_kv(fn, cache: KVCache):
  """fn(x, batch_axis) on every key/value array of `cache`."""
  if cache.stacked:
    return fn(cache.k, 1), fn(cache.v, 1)
  return (tuple(fn(x, 0) for x in cache.k), tuple(fn(x, 0) for x in cache.v))


def grow_cache(cache: KVCache, max_len: int) -> KVCache:
  """`cache` with empty (invalid) slots appended up to `max_len` slots.

  The existing slots keep their keys, values and mask; the new ones are
  zeros with key_mask False, as in `init_cache`. Either layout.
  """
  extra = max_len - cache.max_len
  if extra < 0:
    raise ValueError(f"grow_cache cannot shrink a cache of {cache.max_len} "
                     f"slots to {max_len}.")
  def pad(x, axis):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)
  # The slot axis is two after the batch axis ([B, KVH, S, Dh]).
  k, v = _map_kv(
      lambda x, b: transformer.constrain_kv(pad(x, b + 2)), cache)
  return KVCache(k=k, v=v, key_mask=pad(cache.key_mask, 1))


def repeat_cache(cache: KVCache, repeats: int) -> KVCache:
  """Each row of `cache` repeated `repeats` times, consecutively.

  Row r of the result is row r // repeats of `cache` (`jnp.repeat` on the
  batch axis): B -> B * repeats rows, either layout.
  """
  k, v = _map_kv(
      lambda x, b: transformer.constrain_kv(jnp.repeat(x, repeats, axis=b)),
      cache)
  return KVCache(k=k, v=v,
                 key_mask=jnp.repeat(cache.key_mask, repeats, axis=0))


def repack_cache(cache: KVCache, end, max_len: Optional[int] = None
                 ) -> KVCache:
  """Each row's valid slots moved, in order, to end just before slot `end`.

  With n_b valid slots in row b (`key_mask`) at slots s_0 < ... < s_{n_b-1},
  the result holds slot s_j's keys and values at slot end − n_b + j, and
  every other slot is empty (key_mask False):

    out.key_mask[b, s] = end − n_b <= s < end

  the layout that prefilling a left-padded prompt of width `end` leaves, so
  every row can go on at cache_index = end with positions n_b. Keys are
  stored after RoPE and attention masks by slot order, which is kept, so the
  row's attention is unchanged (a row with holes — slots written while it
  was done — becomes contiguous again, which sliding-window layers need:
  they mask by slot distance). A row with more than `end` valid slots keeps
  its last `end`. Either layout; jitted once per (cache shape, max_len),
  `end` may vary freely.

  Args:
    cache: a `KVCache`.
    end: int or int32 scalar in [0, max_len], the slot after the last kept
      slot of every row.
    max_len: slots of the result (default `cache.max_len`): a cache may be
      repacked into a smaller or larger one.

  Returns:
    The repacked `KVCache` with `max_len` slots.
  """
  max_len = cache.max_len if max_len is None else int(max_len)
  if max_len <= 0:
    raise ValueError(f"repack_cache needs max_len > 0, got {max_len}.")
  if isinstance(end, (int, np.integer)) and not 0 <= end <= max_len:
    raise ValueError(f"repack_cache: end {end} is outside [0, {max_len}].")
  return _jit_repack_cache(cache, jnp.asarray(end, jnp.int32), max_len)


@functools.partial(jax.jit, static_argnums=2)
def _jit_repack_cache(cache, end, max_len):
  valid = cache.key_mask
  count = jnp.sum(valid, axis=1, dtype=jnp.int32)
  # order[b, j]: row b's j-th valid slot (valid slots first, in slot order).
  order = jnp.argsort(~valid, axis=1, stable=True).astype(jnp.int32)
  slot = jnp.arange(max_len, dtype=jnp.int32)
  rank = slot[None, :] - (end - count)[:, None]  # [B, max_len]
  key_mask = (rank >= 0) & (slot[None, :] < end)
  source = jnp.take_along_axis(
      order, jnp.clip(rank, 0, cache.max_len - 1), axis=1)

  def gather(x, batch_axis):
    # source [B, S'] -> index of x's slot axis (two after the batch axis).
    shape = [1] * x.ndim
    shape[batch_axis], shape[batch_axis + 2] = source.shape
    index = source.reshape(shape)
    return transformer.constrain_kv(
        jnp.take_along_axis(x, index, axis=batch_axis + 2))
  k, v = _map_kv(gather, cache)
  return KVCache(k=k, v=v, key_mask=key_mask)


def default_positions(attention_mask: Array) -> Array:
  """cumsum(mask) - 1, clipped at 0: positions counted from the first real
  token (left padding gets position 0). [B, T] -> [B, T] int32."""
  mask = attention_mask.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


def _check_tokens(cfg, tokens, attention_mask, positions):
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}.")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}.")
  for name, array in (("attention_mask", attention_mask),
                      ("positions", positions)):
    if array is not None and array.shape != tokens.shape:
      raise ValueError(f"{name} must have the shape of tokens {tokens.shape}, "
                       f"got {array.shape}.")
  del cfg


def _token_inputs(cfg, tokens, attention_mask, positions):
  """Arrays of (tokens, attention_mask defaulting to all ones, positions),
  checked against each other."""
  tokens = jnp.asarray(tokens)
  if attention_mask is None:
    attention_mask = jnp.ones(tokens.shape, bool)
  attention_mask = jnp.asarray(attention_mask)
  positions = None if positions is None else jnp.asarray(positions)
  _check_tokens(cfg, tokens, attention_mask, positions)
  return tokens, attention_mask, positions


def apply(cfg: config_lib.ModelConfig, params: Params, tokens: Array, *,
          attention_mask: Optional[Array] = None,
          positions: Optional[Array] = None,
          cache: Optional[KVCache] = None,
          cache_index=None,
          head: str = "lm",
          last_only: bool = False,
          sliding_by_position: bool = False
          ) -> Tuple[Array, Optional[KVCache]]:
  """Runs the decoder on tokens [B, T].

  Args:
    cfg: model configuration.
    params: from `init_params` / `load_hf`.
    tokens: [B, T] int token ids.
    attention_mask: [B, T], 1 = real token, 0 = padding (never attended to).
      Defaults to all ones.
    positions: [B, T] RoPE position ids. Defaults to cumsum(mask) - 1 clipped
      at 0, continued after the valid slots already in `cache` (slots below
      `cache_index`).
    cache: optional `KVCache`; the tokens are written at slots
      [cache_index, cache_index + T) and attend to every earlier valid slot.
    cache_index: first slot for the tokens (int or int32 scalar; required
      with a cache). Every index value reuses the same compiled function.
    head: "lm" -> logits [B, T, V]; "score" -> scores [B, T]. Both float32.
    last_only: apply the head to the last token only (out is [B, 1, V] or
      [B, 1]); what a sampler needs after a prefill.
    sliding_by_position: with a cache, measure sliding windows in positions
      (each valid cache slot's position counted as the valid slots before
      it, the default positions) rather than slots: for caches with empty
      slots between a row's valid ones, e.g. a left-padded observation
      appended to a multi-turn episode. No effect without sliding layers.

  Returns:
    (out, new_cache); new_cache is None without a cache.
  """
  tokens = jnp.asarray(tokens)
  attention_mask = (None if attention_mask is None
                    else jnp.asarray(attention_mask))
  positions = None if positions is None else jnp.asarray(positions)
  _check_tokens(cfg, tokens, attention_mask, positions)
  if head not in config_lib.HEAD_NAMES:
    raise ValueError(f"Unknown head {head!r}; expected one of "
                     f"{config_lib.HEAD_NAMES}.")
  batch, length = tokens.shape
  if attention_mask is None:
    attention_mask = jnp.ones((batch, length), bool)
  check_layout(cfg, params)

  if cache is None:
    if cache_index is not None:
      raise ValueError("cache_index was given without a cache.")
    if sliding_by_position:
      raise ValueError("sliding_by_position needs a cache.")
    return _jit_forward(cfg, head, params, tokens, attention_mask,
                        positions, bool(last_only)), None

  if cache_index is None:
    raise ValueError("apply with a cache needs cache_index.")
  if cache.key_mask.shape[0] != batch:
    raise ValueError(f"cache batch size {cache.key_mask.shape[0]} does not "
                     f"match tokens batch size {batch}.")
  if len(cache.k) != cfg.num_layers:
    raise ValueError(f"cache has {len(cache.k)} layers, the config "
                     f"{cfg.num_layers}.")
  if cache.stacked != cfg.scan_layers:
    raise ValueError(f"cache layout (stacked={cache.stacked}) does not match "
                     f"cfg.scan_layers={cfg.scan_layers}; build it with "
                     "init_cache(cfg, ...).")
  if isinstance(cache_index, (int, np.integer)):
    if not 0 <= cache_index <= cache.max_len - length:
      raise ValueError(f"cache_index {cache_index} + {length} new tokens "
                       f"does not fit a cache of {cache.max_len} slots.")
  # Always traced, so that every index reuses one compiled function.
  cache_index = jnp.asarray(cache_index, jnp.int32)
  if sliding_by_position and "sliding" in cfg.attention_kinds:
    return _jit_cached_forward(cfg, head, params, tokens, attention_mask,
                               positions, cache, cache_index, bool(last_only),
                               True)
  return _jit_cached_forward(cfg, head, params, tokens, attention_mask,
                             positions, cache, cache_index, bool(last_only))


@functools.partial(jax.jit, static_argnums=(0, 1, 6))
def _jit_forward(cfg, head, params, tokens, attention_mask, positions,
                 last_only=False):
  """Full causal forward pass without a cache."""
  valid = attention_mask.astype(bool)
  if positions is None:
    positions = default_positions(valid)
  slot = jnp.arange(tokens.shape[1])
  allowed = attention_masks(cfg, slot, slot, valid)
  out, _ = _module(cfg, (head,)).apply({"params": params}, tokens, positions,
                                       allowed, None, 0, head, last_only)
  return out


@functools.partial(jax.jit, static_argnums=(0, 1, 8, 9))
def _jit_cached_forward(cfg, head, params, tokens, attention_mask, positions,
                        cache, cache_index, last_only=False,
                        sliding_by_position=False):
  """Forward pass of new tokens written into the cache at cache_index.

  With `last_only`, the head is applied to the last token only ([B, 1, ...]);
  with `sliding_by_position`, sliding windows count positions (see `apply`).
  """
  valid = attention_mask.astype(bool)
  length, max_len = tokens.shape[1], cache.max_len
  slot = jnp.arange(max_len)
  if positions is None:
    earlier = cache.key_mask & (slot[None, :] < cache_index)
    positions = (jnp.sum(earlier, axis=-1, dtype=jnp.int32)[:, None] +
                 default_positions(valid))
  key_mask = jax.lax.dynamic_update_slice(cache.key_mask, valid,
                                          (0, cache_index))
  query_slot = cache_index + jnp.arange(length)
  if sliding_by_position:
    key_position = jnp.cumsum(key_mask, axis=1, dtype=jnp.int32) - 1
    allowed = attention_masks(cfg, query_slot, slot, key_mask, positions,
                              key_position)
  else:
    allowed = attention_masks(cfg, query_slot, slot, key_mask)
  out, (new_k, new_v) = _module(cfg, (head,)).apply(
      {"params": params}, tokens, positions, allowed, (cache.k, cache.v),
      cache_index, head, last_only)
  return out, KVCache(k=new_k, v=new_v, key_mask=key_mask)


def hidden_states(cfg: config_lib.ModelConfig, params: Params,
                  tokens: Array, attention_mask: Optional[Array] = None,
                  positions: Optional[Array] = None) -> Array:
  """Final-normed hidden states [B, T, D] (activation dtype), before any head.

  The heads are `h @ lm_head_kernel(cfg, params)` (logits [B, T, V]) and the
  score head; callers that must not hold [B, T, V] logits (chunked log-probs,
  the LM loss) start from here.
  """
  tokens, attention_mask, positions = _token_inputs(
      cfg, tokens, attention_mask, positions)
  return _jit_hidden_states(cfg, params, tokens, attention_mask, positions)


@functools.partial(jax.jit, static_argnums=0)
def _jit_hidden_states(cfg, params, tokens, attention_mask, positions):
  valid = attention_mask.astype(bool)
  if positions is None:
    positions = default_positions(valid)
  slot = jnp.arange(tokens.shape[1])
  allowed = attention_masks(cfg, slot, slot, valid)
  hidden, _ = _module(cfg, ()).apply(
      {"params": params}, tokens, positions, allowed, None, 0,
      method=transformer.Decoder.hidden_states)
  return hidden


def lm_head_kernel(cfg: config_lib.ModelConfig, params: Params) -> Array:
  """The LM head as a [D, V] float32 matrix (the embedding's transpose when
  the embeddings are tied): logits = hidden_states @ lm_head_kernel."""
  if cfg.tie_word_embeddings:
    return jnp.asarray(params["embed"]).T
  return jnp.asarray(params["lm_head"])


def logits(cfg: config_lib.ModelConfig, params: Params,
           tokens: Array) -> Array:
  """Token logits [B, T, V] of unpadded tokens (positions 0..T-1)."""
  out, _ = apply(cfg, params, tokens)
  return out


def token_logprobs(cfg: config_lib.ModelConfig, params: Params,
                   tokens: Array, attention_mask: Optional[Array] = None, *,
                   positions: Optional[Array] = None,
                   temperature: float = 1.0,
                   chunk_size: int = lm_head.DEFAULT_CHUNK_SIZE) -> Array:
  """log pi(tokens[t] | tokens[<t]) aligned with the tokens, [B, T] float32.

  Entry t is log softmax(logits[t - 1] / temperature)[tokens[t]]. Entry 0,
  entries on padding, and the first real token of each row (it has no
  context) are 0, so the output can be multiplied by any mask that is a
  subset of `attention_mask`. The LM head runs `chunk_size` positions at a
  time (`lm_head.next_token_stats`), so no [B, T, V] logits are held, in
  the forward or the backward pass.

  Args:
    cfg: model configuration.
    params: parameters with an "lm" head.
    tokens: [B, T] int ids (e.g. prompt + response from the sampler).
    attention_mask: [B, T] 1 = real token; defaults to all ones.
    positions: optional [B, T] position ids (default as in `apply`).
    temperature: divides the logits (1.0 = the policy itself).
    chunk_size: most positions per LM-head chunk.

  Returns:
    [B, T] float32 log-probabilities.
  """
  tokens, attention_mask, positions = _token_inputs(
      cfg, tokens, attention_mask, positions)
  return _jit_token_logprobs(cfg, params, tokens, attention_mask, positions,
                             jnp.float32(temperature), int(chunk_size))


def token_stats(cfg: config_lib.ModelConfig, params: Params, tokens: Array,
                attention_mask: Optional[Array] = None, *,
                positions: Optional[Array] = None, temperature: float = 1.0,
                chunk_size: int = lm_head.DEFAULT_CHUNK_SIZE
                ) -> lm_head.TokenStats:
  """Log-probs, entropies and argmax matches aligned with the tokens.

  Entry t describes p = softmax(logits[t - 1] / temperature): log p[tokens[t]]
  (as `token_logprobs`), the entropy H(p) = −Σ_v p_v log p_v, and whether
  tokens[t] is argmax p. All [B, T]; 0 (False) at entry 0, on padding and on
  each row's first real token. Arguments as in `token_logprobs`.
  """
  tokens, attention_mask, positions = _token_inputs(
      cfg, tokens, attention_mask, positions)
  return _jit_token_logprobs(cfg, params, tokens, attention_mask, positions,
                             jnp.float32(temperature), int(chunk_size), True)


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def _jit_token_logprobs(cfg, params, tokens, attention_mask, positions,
                        temperature, chunk_size=lm_head.DEFAULT_CHUNK_SIZE,
                        with_stats=False):
  hidden = hidden_states(cfg, params, tokens, attention_mask, positions)
  return lm_head.next_token_stats(
      hidden, lm_head_kernel(cfg, params), tokens, attention_mask,
      temperature=temperature, chunk_size=chunk_size, with_stats=with_stats)
