"""Hugging Face checkpoint I/O (safetensors only) and the config.json readers.

Supported `model_type`s: qwen2, qwen3, llama, mistral and gemma3_text. All
run on the one decoder of `models/transformer.py`; what tells them apart is
read here, one small reader per family (`_READERS`), into `ModelConfig`
fields (see docs/models.md for the keys each reader understands). A key
whose value the decoder does not implement fails naming the file and the
key.

    cfg, params = load_hf("/path/to/Qwen2.5-0.5B")  # config.json + weights
    save_hf("/tmp/out", cfg, params)                # readable by transformers

Weights are read with `safetensors` one tensor at a time (never pickle), from
`model.safetensors` or from the shards listed in
`model.safetensors.index.json`. Tensor names and layouts (HF
`nn.Linear.weight` is [out, in]); `P` = `model.layers.{i}.`, ours under
`layers_{i}`:

  model.embed_tokens.weight [V, D]       -> embed [V, D]
  P self_attn.q_proj.weight [H*Dh, D]    -> attention.q_kernel [D, H, Dh]
  P self_attn.{k,v}_proj.weight          -> attention.{k,v}_kernel [D, KVH, Dh]
  P self_attn.{q,k,v}_proj.bias [N*Dh]   -> attention.{q,k,v}_bias [N, Dh]
  P self_attn.o_proj.weight [D, H*Dh]    -> attention.o_kernel [H, Dh, D]
  P mlp.{gate,up}_proj.weight [F, D]     -> mlp.{gate,up}_kernel [D, F]
  P mlp.down_proj.weight [D, F]          -> mlp.down_kernel [F, D]
  P self_attn.{q,k}_norm.weight [Dh]     -> attention.{q,k}_norm.scale
                                            (qk_norm: Qwen3, Gemma 3)
  P input_layernorm.weight               -> input_norm.scale
  P post_attention_layernorm.weight      -> post_attention_norm.scale
  P {pre,post}_feedforward_layernorm.weight
                                         -> {pre,post}_feedforward_norm.scale
                                            (sandwich norms: Gemma 3)
  model.norm.weight                      -> final_norm.scale
  lm_head.weight [V, D]                  -> lm_head [D, V] (untied only)
  score.weight [1, D], score.bias [1]    -> score_kernel, score_bias

The `score.*` tensors are this package's own extension for value models and
PRMs (loaded when present, written when the params have a score head).

With `scan_layers=True` the per-layer tensors are stacked on a leading [L]
axis under `layers` (e.g. `layers.attention.q_kernel` [L, D, H, Dh]); the
files are the same in both layouts. How the model runs (`dtype`,
`scan_layers`, `remat`) is not in config.json: the caller passes it.
"""

import dataclasses
import json
import math
import os
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import numpy as np
from safetensors import numpy as safetensors_numpy

from rl_rewards import errors
from rl_rewards.models import config as config_lib
from rl_rewards.models import model as model_lib
from rl_rewards.models import transformer
from rl_rewards.models import weights_io

Params = Any

_CONFIG_FILE = "config.json"
_HF_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# Hugging Face `layer_types` entries <-> ours.
_HF_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_OUR_LAYER_TYPES = {v: k for k, v in _HF_LAYER_TYPES.items()}
_SUPPORTED_ROPE = ("default",) + config_lib.ROPE_TYPES


# ------------------------------------------------------------------- config --


class _Keys:
  """Typed access to a parsed config.json; every error names file and key."""

  def __init__(self, hf_config, path):
    self.config = hf_config
    self.path = path

  def error(self, message):
    return errors.InputError(f"{self.path}: {message}")

  def get(self, key, default=None):
    value = self.config.get(key)
    return default if value is None else value

  def number(self, key, kind=int, default=None, where=None):
    """config[key] (or where[key]) as int / float; null means the default."""
    source = self.config if where is None else where
    value = source.get(key)
    if value is None:  # Absent or null: the default, if there is one.
      if default is None:
        raise self.error(f"missing key {key!r}.")
      value = default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        (kind is int and value != int(value))):
      raise self.error(f"{key!r} must be "
                       f"{'an integer' if kind is int else 'a number'}, got "
                       f"{value!r}.")
    return kind(value)

  def flag(self, key, default=False):
    value = self.config.get(key)
    if value is None:
      return default
    if not isinstance(value, bool):
      raise self.error(f"{key!r} must be true or false, got {value!r}.")
    return value

  def reject_true(self, key, why):
    if self.config.get(key):
      raise self.error(f"{key}={json.dumps(self.config[key])} is not "
                       f"supported ({why}).")

  def reject_set(self, key, why):
    if self.config.get(key) is not None:
      raise self.error(f"{key}={json.dumps(self.config[key])} is not "
                       f"supported ({why}); it must be null or absent.")

  def activation(self, keys, allowed):
    for key in keys:
      if self.config.get(key) is not None:
        value = self.config[key]
        if value not in allowed:
          raise self.error(f"{key} {value!r} is not supported (only "
                           f"{', '.join(sorted(allowed))}).")
        return allowed[value]
    return next(iter(allowed.values()))


def _rope_entry(keys: _Keys, entry, name: str, max_positions: int,
                default_theta: float) -> Tuple[float, Any]:
  """(theta, RopeScaling or None) of one RoPE dict named `name` in errors.

  `entry` is a `rope_parameters` dict (or per-layer-type entry) or a legacy
  `rope_scaling` dict (then its theta comes from `default_theta`, the
  top-level `rope_theta`). The type is `rope_type`, or the older `type`.
  """
  if entry is None:
    entry = {}
  if not isinstance(entry, dict):
    raise keys.error(f"{name} must be an object, got {entry!r}.")
  theta = keys.number("rope_theta", float, default_theta, where=entry)
  rope_type = entry.get("rope_type") or entry.get("type") or "default"
  if rope_type not in _SUPPORTED_ROPE:
    raise keys.error(
        f"{name}: rope type {rope_type!r} is not supported; expected one "
        f"of {list(_SUPPORTED_ROPE)}.")
  partial = entry.get("partial_rotary_factor", keys.get(
      "partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    raise keys.error(f"{name}: partial_rotary_factor={partial!r} is not "
                     "supported (RoPE on the whole head only).")
  if rope_type == "default":
    return theta, None

  def value(key, kind=float, default=None):
    try:
      return keys.number(key, kind, default, where=entry)
    except errors.InputError as e:
      raise keys.error(f"{name}: rope type {rope_type!r}: "
                       f"{str(e).split(': ', 1)[1]}") from None
  original = value("original_max_position_embeddings", int, max_positions)
  fields = {}
  if rope_type == "linear":
    factor = value("factor")
  elif rope_type == "llama3":
    factor = value("factor")
    fields = dict(low_freq_factor=value("low_freq_factor"),
                  high_freq_factor=value("high_freq_factor"),
                  original_max_position_embeddings=original)
  else:  # yarn
    factor = (value("factor") if entry.get("factor") is not None
              else max_positions / original)
    attention_factor = entry.get("attention_factor")
    if attention_factor is None:
      attention_factor = transformer.yarn_attention_factor(
          factor, entry.get("mscale"), entry.get("mscale_all_dim"))
    fields = dict(
        original_max_position_embeddings=original,
        # transformers: `get("beta_fast") or 32`, so 0 also means 32.
        beta_fast=float(entry.get("beta_fast") or 32),
        beta_slow=float(entry.get("beta_slow") or 1),
        attention_factor=value("attention_factor", float, attention_factor),
        truncate=bool(entry.get("truncate", True)))
  try:
    return theta, config_lib.RopeScaling(rope_type=rope_type, factor=factor,
                                         **fields)
  except ValueError as e:
    raise keys.error(f"{name}: {e}") from None


def _global_rope(keys: _Keys, max_positions: int) -> Dict[str, Any]:
  """RoPE of a model with one RoPE for every layer.

  As transformers' `convert_rope_params_to_dict`: the legacy `rope_scaling`
  dict wins over `rope_parameters`; the base is the dict's `rope_theta`, else
  the top-level `rope_theta`, else 10000.
  """
  top_theta = keys.number("rope_theta", float, 10_000.0)
  if keys.get("rope_scaling") is not None:
    entry, name = keys.config["rope_scaling"], "rope_scaling"
  else:
    entry, name = keys.get("rope_parameters"), "rope_parameters"
  theta, scaling = _rope_entry(keys, entry, name, max_positions, top_theta)
  return dict(rope_theta=theta, rope_scaling=scaling)


def _layer_types(keys: _Keys, num_layers: int):
  """Our layer types from config.json's `layer_types` (None if absent)."""
  raw = keys.get("layer_types")
  if raw is None:
    return None
  if (not isinstance(raw, list) or len(raw) != num_layers or
      any(t not in _HF_LAYER_TYPES for t in raw)):
    raise keys.error(f"layer_types must list {num_layers} entries from "
                     f"{sorted(_HF_LAYER_TYPES)}, got {raw!r}.")
  return tuple(_HF_LAYER_TYPES[t] for t in raw)


def _qwen_sliding(keys: _Keys, num_layers: int) -> Dict[str, Any]:
  """Qwen2 / Qwen3 sliding windows: only with `use_sliding_window`, on the
  layers `layer_types` marks (default: from `max_window_layers` on)."""
  if not keys.flag("use_sliding_window"):
    return {}
  window = keys.number("sliding_window", int, 4096)
  types = _layer_types(keys, num_layers)
  if types is None:
    first = keys.number("max_window_layers", int, 28)
    types = tuple("sliding" if i >= first else "full"
                  for i in range(num_layers))
  if "sliding" not in types:
    return {}
  return dict(layer_types=types, sliding_window=window)


def _common(keys: _Keys, *, head_dim=None, tie=False) -> Dict[str, Any]:
  """The fields every family spells the same way."""
  num_heads = keys.number("num_attention_heads")
  hidden_size = keys.number("hidden_size")
  if keys.get("head_dim"):
    head_dim = keys.number("head_dim")
  elif head_dim is None:
    head_dim = hidden_size // max(num_heads, 1)
  return dict(
      vocab_size=keys.number("vocab_size"),
      hidden_size=hidden_size,
      num_layers=keys.number("num_hidden_layers"),
      num_heads=num_heads,
      num_kv_heads=keys.number("num_key_value_heads", default=num_heads),
      head_dim=head_dim,
      intermediate_size=keys.number("intermediate_size"),
      rms_norm_eps=keys.number("rms_norm_eps", float, 1e-6),
      tie_word_embeddings=keys.flag("tie_word_embeddings", tie),
      max_position_embeddings=keys.number("max_position_embeddings",
                                          default=2048))


_SILU = {"silu": "silu"}


def _read_qwen2(keys: _Keys) -> Dict[str, Any]:
  fields = _common(keys)
  keys.activation(("hidden_act",), _SILU)
  fields.update(_global_rope(keys, fields["max_position_embeddings"]))
  fields.update(_qwen_sliding(keys, fields["num_layers"]))
  fields["attention_bias"] = True  # Qwen2 always has q/k/v biases.
  return fields


def _read_qwen3(keys: _Keys) -> Dict[str, Any]:
  fields = _common(keys, head_dim=128)
  keys.activation(("hidden_act",), _SILU)
  keys.reject_true("attention_bias", "it also adds an o_proj bias")
  fields.update(_global_rope(keys, fields["max_position_embeddings"]))
  fields.update(_qwen_sliding(keys, fields["num_layers"]))
  fields.update(attention_bias=False, qk_norm=True)
  return fields


def _read_llama(keys: _Keys) -> Dict[str, Any]:
  fields = _common(keys)
  keys.activation(("hidden_act",), _SILU)
  keys.reject_true("mlp_bias", "no MLP biases")
  keys.reject_true("attention_bias", "it also adds an o_proj bias")
  fields.update(_global_rope(keys, fields["max_position_embeddings"]))
  fields["attention_bias"] = False
  return fields


def _read_mistral(keys: _Keys) -> Dict[str, Any]:
  fields = _common(keys)
  keys.activation(("hidden_act",), _SILU)
  fields.update(_global_rope(keys, fields["max_position_embeddings"]))
  fields["attention_bias"] = False
  window = keys.get("sliding_window")
  if window is not None:  # Every layer slides.
    fields.update(layer_types=("sliding",) * fields["num_layers"],
                  sliding_window=keys.number("sliding_window"))
  return fields


def _read_gemma3_text(keys: _Keys) -> Dict[str, Any]:
  fields = _common(keys, head_dim=256, tie=True)
  keys.activation(("hidden_activation", "hidden_act"),
                  {"gelu_pytorch_tanh": "gelu_tanh"})
  keys.reject_true("attention_bias", "it also adds an o_proj bias")
  keys.reject_true("use_bidirectional_attention", "causal attention only")
  keys.reject_set("final_logit_softcapping", "no logit soft-capping")
  keys.reject_set("attn_logit_softcapping",
                  "no attention-score soft-capping")
  num_layers = fields["num_layers"]
  types = _layer_types(keys, num_layers)
  if types is None:  # The older spelling: every pattern-th layer is full.
    pattern = keys.number("sliding_window_pattern", int, 6)
    if pattern <= 0:
      raise keys.error(f"'sliding_window_pattern' must be > 0, got {pattern}.")
    types = tuple("sliding" if (i + 1) % pattern else "full"
                  for i in range(num_layers))
  # As Gemma3TextConfig: a `rope_parameters` per layer type, else the legacy
  # rope_theta (+ rope_scaling, full layers only) and rope_local_base_freq.
  max_positions = fields["max_position_embeddings"]
  rope = keys.get("rope_parameters") or {}
  if not isinstance(rope, dict):
    raise keys.error(f"rope_parameters must be an object, got {rope!r}.")
  unknown = sorted(set(rope) - set(_HF_LAYER_TYPES))
  if unknown:
    raise keys.error(
        f"rope_parameters has keys {unknown}; Gemma 3 expects one entry per "
        f"layer type {sorted(_HF_LAYER_TYPES)}.")
  full = dict(rope.get("full_attention") or {"rope_type": "default"})
  if keys.get("rope_scaling") is not None:
    if not isinstance(keys.config["rope_scaling"], dict):
      raise keys.error("rope_scaling must be an object, got "
                       f"{keys.config['rope_scaling']!r}.")
    full.update(keys.config["rope_scaling"])
  theta, scaling = _rope_entry(
      keys, full, "rope_parameters.full_attention", max_positions,
      keys.number("rope_theta", float, 1_000_000.0))
  local_theta, local_scaling = _rope_entry(
      keys, rope.get("sliding_attention"), "rope_parameters.sliding_attention",
      max_positions, keys.number("rope_local_base_freq", float, 10_000.0))
  if local_scaling is not None:
    raise keys.error("rope_parameters.sliding_attention: rope type "
                     f"{local_scaling.rope_type!r} is not supported for the "
                     "sliding layers (only default).")
  fields.update(
      attention_bias=False, qk_norm=True, norm_placement="sandwich",
      rms_scale_offset=1.0, mlp_activation="gelu_tanh",
      embed_scale=math.sqrt(fields["hidden_size"]),
      query_pre_attn_scalar=keys.number("query_pre_attn_scalar", float, 256),
      rope_theta=theta, rope_scaling=scaling, local_rope_theta=local_theta)
  if "sliding" in types:
    fields.update(layer_types=types,
                  sliding_window=keys.number("sliding_window", int, 4096))
  return fields


# model_type -> reader of the config.json keys that family defines.
_READERS = {
    "qwen2": _read_qwen2,
    "qwen3": _read_qwen3,
    "llama": _read_llama,
    "mistral": _read_mistral,
    "gemma3_text": _read_gemma3_text,
}


def read_hf_config(config_path: str) -> Dict[str, Any]:
  """The parsed config.json; errors name the file."""
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"{config_path} does not exist.")
  try:
    with open(config_path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.InputError(f"{config_path}: invalid JSON ({e}).") from None


def config_from_hf(hf_config: Dict[str, Any], *, dtype: str = "float32",
                   path: str = _CONFIG_FILE, scan_layers: bool = False,
                   remat: str = "none") -> config_lib.ModelConfig:
  """`ModelConfig` from a parsed Hugging Face config.json dict.

  Args:
    hf_config: the parsed config.json.
    dtype: activation dtype ("float32" / "bfloat16").
    path: where hf_config came from (for error messages).
    scan_layers: `ModelConfig.scan_layers` (the parameter layout).
    remat: `ModelConfig.remat` ("none" / "full" / "dots").

  Returns:
    The validated `ModelConfig`. A key whose value this decoder does not
    implement raises `errors.InputError` naming the file and the key.
  """
  if not isinstance(hf_config, dict):
    raise errors.InputError(f"{path}: expected a JSON object, got "
                            f"{type(hf_config).__name__}.")
  model_type = hf_config.get("model_type")
  if model_type not in _READERS:
    raise errors.InputError(
        f"{path}: model_type {model_type!r} is not supported; expected one "
        f"of {sorted(_READERS)}.")
  fields = _READERS[model_type](_Keys(hf_config, path))
  try:
    return config_lib.ModelConfig(
        **fields, dtype=dtype, architecture=model_type,
        scan_layers=scan_layers, remat=remat)
  except errors.InputError:
    raise
  except ValueError as e:  # ModelConfig's own checks.
    raise errors.InputError(f"{path}: {e}") from None


def _int_if_whole(x):
  return int(x) if float(x).is_integer() else x


def _rope_dict(theta, scaling) -> Dict[str, Any]:
  """A `rope_parameters` entry (also the legacy `rope_scaling` without
  rope_theta)."""
  out = {"rope_theta": theta, "rope_type": "default"}
  if scaling is None:
    return out
  out["rope_type"] = scaling.rope_type
  out["factor"] = scaling.factor
  if scaling.rope_type == "llama3":
    out.update(low_freq_factor=scaling.low_freq_factor,
               high_freq_factor=scaling.high_freq_factor,
               original_max_position_embeddings=(
                   scaling.original_max_position_embeddings))
  elif scaling.rope_type == "yarn":
    out.update(original_max_position_embeddings=(
        scaling.original_max_position_embeddings),
               beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow,
               attention_factor=scaling.attention_factor,
               truncate=scaling.truncate)
  return out


def config_to_hf(cfg: config_lib.ModelConfig) -> Dict[str, Any]:
  """A Hugging Face config.json dict for `cfg` (float32 weights).

  Raises ValueError when `cfg` has a feature its `architecture` cannot
  express (e.g. q/k norms on "llama"): `config_from_hf` of the result must
  give `cfg` back.
  """
  arch = cfg.architecture
  hf_config = {
      "architectures": [_HF_ARCHITECTURES[arch]],
      "model_type": arch,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "intermediate_size": cfg.intermediate_size,
      "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "attention_dropout": 0.0,
      "dtype": "float32",
      "torch_dtype": "float32",
  }
  kinds = cfg.layer_kinds
  hf_types = [_OUR_LAYER_TYPES[t] for t in kinds]
  if arch == "gemma3_text":
    hf_config.update({
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": _int_if_whole(cfg.query_pre_attn_scalar),
        "sliding_window": cfg.sliding_window,
        "layer_types": hf_types,
        "attention_bias": False,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
        # The legacy keys and the per-layer-type rope_parameters.
        "rope_theta": cfg.rope_theta,
        "rope_local_base_freq": cfg.local_rope_theta,
        "rope_parameters": {
            "full_attention": _rope_dict(cfg.rope_theta, cfg.rope_scaling),
            "sliding_attention": _rope_dict(cfg.local_rope_theta, None)},
    })
    if cfg.rope_scaling is not None:
      legacy = _rope_dict(cfg.rope_theta, cfg.rope_scaling)
      del legacy["rope_theta"]
      hf_config["rope_scaling"] = legacy
  else:
    hf_config["hidden_act"] = "silu"
    # Both spellings: older readers use rope_theta (+ rope_scaling), newer
    # rope_parameters.
    hf_config["rope_theta"] = cfg.rope_theta
    hf_config["rope_parameters"] = _rope_dict(cfg.rope_theta,
                                              cfg.rope_scaling)
    if cfg.rope_scaling is not None:
      legacy = _rope_dict(cfg.rope_theta, cfg.rope_scaling)
      del legacy["rope_theta"]
      hf_config["rope_scaling"] = legacy
  if arch in ("qwen2", "qwen3"):
    sliding = "sliding" in kinds
    hf_config["use_sliding_window"] = sliding
    if sliding:
      hf_config["sliding_window"] = cfg.sliding_window
      hf_config["layer_types"] = hf_types
      hf_config["max_window_layers"] = kinds.index("sliding")
    if arch == "qwen3":
      hf_config["attention_bias"] = False
  elif arch == "llama":
    hf_config["attention_bias"] = False
    hf_config["mlp_bias"] = False
  elif arch == "mistral":
    hf_config["sliding_window"] = (cfg.sliding_window if "sliding" in kinds
                                   else None)
  expressed = config_from_hf(json.loads(json.dumps(hf_config)),
                             dtype=cfg.dtype, scan_layers=cfg.scan_layers,
                             remat=cfg.remat)
  if expressed != cfg:
    differ = [f.name for f in dataclasses.fields(cfg)
              if getattr(expressed, f.name) != getattr(cfg, f.name)]
    raise ValueError(
        f"model_type {arch!r} cannot express this ModelConfig: it differs "
        f"in {differ} (e.g. {differ[0]}={getattr(cfg, differ[0])!r}, the "
        f"{arch} config.json gives {getattr(expressed, differ[0])!r}).")
  return hf_config


# -------------------------------------------------------------- name mapping --


def _tensor_layouts(cfg: config_lib.ModelConfig, heads) -> Dict[
    Tuple[str, ...], Tuple[str, Tuple[int, ...], Callable, Callable]]:
  """params path -> (HF name, HF shape, hf_to_ours, ours_to_hf).

  Paths are those of the per-layer layout (`layers_{i}`) whatever
  `cfg.scan_layers`; `load_hf` stacks them, `save_hf` unstacks first.
  """
  d, f, dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  h, kvh, v = cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size

  def same(x):
    return x

  def linear_in(num_heads):  # [N*Dh, D] <-> [D, N, Dh]
    return (lambda w: w.T.reshape(d, num_heads, dh),
            lambda k: k.reshape(d, num_heads * dh).T)

  def bias(num_heads):  # [N*Dh] <-> [N, Dh]
    return (lambda b: b.reshape(num_heads, dh),
            lambda b: b.reshape(num_heads * dh))

  def transpose(x):
    return x.T

  o_proj = (lambda w: w.T.reshape(h, dh, d), lambda k: k.reshape(h * dh, d).T)
  layouts = {("embed",): ("model.embed_tokens.weight", (v, d), same, same),
             ("final_norm", "scale"): ("model.norm.weight", (d,), same, same)}
  for i in range(cfg.num_layers):
    prefix, ours = f"model.layers.{i}.", f"layers_{i}"
    attn = prefix + "self_attn."
    for name, n in (("q", h), ("k", kvh), ("v", kvh)):
      layouts[(ours, "attention", f"{name}_kernel")] = (
          f"{attn}{name}_proj.weight", (n * dh, d), *linear_in(n))
      if cfg.attention_bias:
        layouts[(ours, "attention", f"{name}_bias")] = (
            f"{attn}{name}_proj.bias", (n * dh,), *bias(n))
    layouts[(ours, "attention", "o_kernel")] = (
        f"{attn}o_proj.weight", (d, h * dh), *o_proj)
    for name in ("gate", "up"):
      layouts[(ours, "mlp", f"{name}_kernel")] = (
          f"{prefix}mlp.{name}_proj.weight", (f, d), transpose, transpose)
    layouts[(ours, "mlp", "down_kernel")] = (
        f"{prefix}mlp.down_proj.weight", (d, f), transpose, transpose)
    if cfg.qk_norm:
      for name in ("q", "k"):
        layouts[(ours, "attention", f"{name}_norm", "scale")] = (
            f"{attn}{name}_norm.weight", (dh,), same, same)
    norms = [("input_norm", "input_layernorm"),
             ("post_attention_norm", "post_attention_layernorm")]
    if cfg.norm_placement == "sandwich":
      norms += [("pre_feedforward_norm", "pre_feedforward_layernorm"),
                ("post_feedforward_norm", "post_feedforward_layernorm")]
    for name, hf_name in norms:
      layouts[(ours, name, "scale")] = (
          f"{prefix}{hf_name}.weight", (d,), same, same)
  if "lm" in heads and not cfg.tie_word_embeddings:
    layouts[("lm_head",)] = ("lm_head.weight", (v, d), transpose, transpose)
  if "score" in heads:
    layouts[("score_kernel",)] = ("score.weight", (1, d), transpose, transpose)
    layouts[("score_bias",)] = ("score.bias", (1,), same, same)
  return layouts


def _set_path(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


# --------------------------------------------------------------------- load --


def load_hf(path: str, *, dtype: str = "float32",
            shardings: Optional[Params] = None, scan_layers: bool = False,
            remat: str = "none") -> Tuple[config_lib.ModelConfig, Params]:
  """Loads a Hugging Face checkpoint directory (any supported model_type).

  Args:
    path: directory with config.json and model.safetensors (or sharded
      safetensors with model.safetensors.index.json).
    dtype: activation dtype of the returned config ("float32"/"bfloat16");
      parameters are always converted to float32.
    shardings: optional pytree of `jax.sharding.Sharding` with the structure
      of the params; each tensor is then placed directly into its sharding,
      one tensor at a time (one stacked [L, ...] tensor at a time with
      `scan_layers`, assembled on the host).
    scan_layers: return the stacked layout of scanned blocks (see
      `ModelConfig.scan_layers`); the config says so too.
    remat: `ModelConfig.remat` of the returned config.

  Returns:
    (model_config, params). params has an "lm" head, plus a "score" head when
    the checkpoint holds `score.weight`.
  """
  config_path = os.path.join(path, _CONFIG_FILE)
  hf_config = read_hf_config(config_path)
  cfg = config_from_hf(hf_config, dtype=dtype, path=config_path,
                       scan_layers=scan_layers, remat=remat)
  reader = weights_io.TensorReader(path)
  heads = ("lm", "score") if "score.weight" in reader else ("lm",)
  layouts = _tensor_layouts(cfg, heads)

  def read(ours):
    name, shape, to_ours, _ = layouts[ours]
    tensor, file = reader.get(name)
    if tuple(tensor.shape) != shape:
      raise errors.InputError(f"{file}: tensor {name!r} has shape "
                              f"{tuple(tensor.shape)}, expected {shape} from "
                              f"{config_path}.")
    return np.ascontiguousarray(to_ours(tensor.astype(np.float32)))

  # Destination paths in the layout of cfg, each with its per-layer sources.
  targets = {}
  for ours in layouts:
    if cfg.scan_layers and ours[0].startswith("layers_"):
      targets.setdefault(("layers",) + ours[1:], []).append(ours)
    else:
      targets[ours] = [ours]
  params = {}
  try:
    for target, sources in targets.items():
      if len(sources) == 1 and sources[0] == target:
        value = read(target)
      else:  # Sources are layers_0 ... layers_{L-1}, in order.
        value = np.stack([read(source) for source in sources])
      if shardings is not None:
        try:
          sharding = _get_path(shardings, target)
        except (KeyError, TypeError):
          raise ValueError(f"shardings has no entry for params path "
                           f"{'/'.join(target)}.") from None
        value = jax.device_put(value, sharding)
      else:
        value = jax.numpy.asarray(value)
      _set_path(params, target, value)
  finally:
    reader.close()
  return cfg, params


# --------------------------------------------------------------------- save --


def save_hf(path: str, cfg: config_lib.ModelConfig, params: Params) -> None:
  """Writes config.json and model.safetensors (float32) in the HF layout.

  The files are written under temporary names and renamed when complete; a
  save that fails (a full disk raises `OSError` ENOSPC naming `path`) leaves
  the files already in `path` unchanged.

  The result loads with transformers' `AutoModelForCausalLM.from_pretrained`
  and with `load_hf`; save -> load -> save is bit-identical. `params` are in
  the layout of `cfg` (stacked when `cfg.scan_layers`); the files are the
  same for both layouts.
  """
  model_lib.check_layout(cfg, params)
  if cfg.scan_layers:
    params = model_lib.unstack_layers(cfg, jax.device_get(params))
  heads = ()
  if "lm_head" in params or cfg.tie_word_embeddings:
    heads += ("lm",)
  if "score_kernel" in params:
    heads += ("score",)
  tensors = {}
  layouts = _tensor_layouts(cfg, heads)
  for ours, (name, shape, _, to_hf) in layouts.items():
    try:
      value = _get_path(params, ours)
    except (KeyError, TypeError):
      raise ValueError(f"params has no entry {'/'.join(ours)} needed for "
                       f"{name!r}.") from None
    value = np.asarray(jax.device_get(value), dtype=np.float32)
    tensors[name] = np.ascontiguousarray(to_hf(value))
    if tensors[name].shape != shape:
      raise ValueError(f"params {'/'.join(ours)} gives {name!r} of shape "
                       f"{tensors[name].shape}, expected {shape}.")
  os.makedirs(path, exist_ok=True)
  # Both files are written under temporary names first, so a failed save
  # (e.g. a full disk) leaves an earlier export in `path` as it was.
  final = [os.path.join(path, weights_io.WEIGHTS_FILE),
           os.path.join(path, _CONFIG_FILE)]
  temporary = [f"{name}.tmp{os.getpid()}" for name in final]
  try:
    safetensors_numpy.save_file(tensors, temporary[0],
                                metadata={"format": "pt"})
    with open(temporary[1], "w") as f:
      json.dump(config_to_hf(cfg), f, indent=2, sort_keys=True)
      f.write("\n")
  except BaseException as e:
    for name in temporary:
      if os.path.exists(name):
        os.remove(name)
    if errors.is_disk_full(e):
      raise errors.disk_full(path, "files already there are unchanged") from e
    raise
  for tmp, name in zip(temporary, final):
    os.replace(tmp, name)
