"""Hugging Face checkpoint I/O for Qwen2 / Llama decoders (safetensors only).

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
  P input_layernorm.weight               -> input_norm.scale
  P post_attention_layernorm.weight      -> post_attention_norm.scale
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

import json
import os
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import numpy as np
from safetensors import numpy as safetensors_numpy
import safetensors

from rl_rewards import errors
from rl_rewards.models import config as config_lib
from rl_rewards.models import model as model_lib

Params = Any

_WEIGHTS_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"
_CONFIG_FILE = "config.json"
_HF_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


# ------------------------------------------------------------------- config --


def _rope_theta(hf_config, path):
  rope = hf_config.get("rope_parameters") or {}
  scaling = hf_config.get("rope_scaling") or {}
  rope_type = (rope.get("rope_type") or scaling.get("rope_type") or
               scaling.get("type") or "default")
  if rope_type != "default":
    raise errors.InputError(
        f"{path}: rope type {rope_type!r} is not supported (only the default "
        "RoPE).")
  theta = rope.get("rope_theta", hf_config.get("rope_theta", 10_000.0))
  return float(theta)


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
    The validated `ModelConfig`.
  """
  if not isinstance(hf_config, dict):
    raise errors.InputError(f"{path}: expected a JSON object, got "
                            f"{type(hf_config).__name__}.")
  model_type = hf_config.get("model_type")
  if model_type not in _HF_ARCHITECTURES:
    raise errors.InputError(
        f"{path}: model_type {model_type!r} is not supported; expected one "
        f"of {sorted(_HF_ARCHITECTURES)}.")
  if hf_config.get("hidden_act", "silu") != "silu":
    raise errors.InputError(
        f"{path}: hidden_act {hf_config['hidden_act']!r} is not supported "
        "(only silu).")
  if model_type == "qwen2":
    if hf_config.get("use_sliding_window"):
      raise errors.InputError(
          f"{path}: use_sliding_window=true is not supported.")
    attention_bias = True  # Qwen2 always has q/k/v biases.
  else:
    if hf_config.get("mlp_bias"):
      raise errors.InputError(f"{path}: mlp_bias=true is not supported.")
    if hf_config.get("attention_bias"):
      raise errors.InputError(
          f"{path}: attention_bias=true is not supported for Llama (it also "
          "adds an o_proj bias).")
    attention_bias = False
  def number(key, kind=int, default=None):
    value = hf_config.get(key)
    if value is None:  # Absent or null: the default, if there is one.
      if default is None:
        raise errors.InputError(f"{path}: missing key {key!r}.")
      value = default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        (kind is int and value != int(value))):
      raise errors.InputError(f"{path}: {key!r} must be "
                              f"{'an integer' if kind is int else 'a number'}"
                              f", got {value!r}.")
    return kind(value)

  num_heads = number("num_attention_heads")
  hidden_size = number("hidden_size")
  try:
    return config_lib.ModelConfig(
        vocab_size=number("vocab_size"),
        hidden_size=hidden_size,
        num_layers=number("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=number("num_key_value_heads", default=num_heads),
        head_dim=(number("head_dim") if hf_config.get("head_dim") else
                  hidden_size // max(num_heads, 1)),
        intermediate_size=number("intermediate_size"),
        rope_theta=_rope_theta(hf_config, path),
        rms_norm_eps=number("rms_norm_eps", float, 1e-6),
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        max_position_embeddings=number("max_position_embeddings",
                                       default=2048),
        dtype=dtype,
        architecture=model_type,
        scan_layers=scan_layers,
        remat=remat)
  except errors.InputError:
    raise
  except ValueError as e:  # ModelConfig's own checks.
    raise errors.InputError(f"{path}: {e}") from None


def config_to_hf(cfg: config_lib.ModelConfig) -> Dict[str, Any]:
  """A Hugging Face config.json dict for `cfg` (float32 weights)."""
  hf_config = {
      "architectures": [_HF_ARCHITECTURES[cfg.architecture]],
      "model_type": cfg.architecture,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "intermediate_size": cfg.intermediate_size,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.rms_norm_eps,
      # Both spellings: older readers use rope_theta, newer rope_parameters.
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_theta": cfg.rope_theta,
                          "rope_type": "default"},
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "attention_dropout": 0.0,
      "dtype": "float32",
      "torch_dtype": "float32",
  }
  if cfg.architecture == "qwen2":
    hf_config["use_sliding_window"] = False
  else:
    hf_config["attention_bias"] = False
    hf_config["mlp_bias"] = False
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
    layouts[(ours, "input_norm", "scale")] = (
        f"{prefix}input_layernorm.weight", (d,), same, same)
    layouts[(ours, "post_attention_norm", "scale")] = (
        f"{prefix}post_attention_layernorm.weight", (d,), same, same)
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


def _open_safetensors(file):
  try:
    return safetensors.safe_open(file, framework="numpy")
  except Exception as e:  # pylint: disable=broad-except
    # E.g. "Error while deserializing header: incomplete metadata".
    raise errors.InputError(
        f"{file}: not a readable safetensors file (truncated or corrupt?): "
        f"{e}") from None


class _TensorReader:
  """Reads single tensors from one or several safetensors files."""

  def __init__(self, path):
    single = os.path.join(path, _WEIGHTS_FILE)
    index = os.path.join(path, _INDEX_FILE)
    if os.path.isfile(single):
      with _open_safetensors(single) as f:
        self._file_of = {name: single for name in f.keys()}
    elif os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
      except (json.JSONDecodeError, UnicodeDecodeError, KeyError,
              TypeError) as e:
        raise errors.InputError(f"{index}: not a safetensors index with a "
                                f"'weight_map' ({e}).") from None
      self._file_of = {name: os.path.join(path, file)
                       for name, file in weight_map.items()}
      for file in sorted(set(self._file_of.values())):
        if not os.path.isfile(file):
          raise FileNotFoundError(f"{file} (listed in {index}) is missing.")
    else:
      raise FileNotFoundError(
          f"No {_WEIGHTS_FILE} or {_INDEX_FILE} in {path}.")
    self.source = single if os.path.isfile(single) else index
    self._handles = {}

  def __contains__(self, name):
    return name in self._file_of

  def get(self, name):
    if name not in self._file_of:
      raise errors.InputError(f"{self.source}: tensor {name!r} is missing.")
    file = self._file_of[name]
    if file not in self._handles:
      self._handles[file] = _open_safetensors(file)
    try:
      tensor = self._handles[file].get_tensor(name)
    except Exception as e:  # pylint: disable=broad-except
      # safetensors' own error names neither the file nor the index.
      raise errors.InputError(
          f"{file}: cannot read tensor {name!r} (listed for it in "
          f"{self.source}): {e}") from None
    if tensor.dtype.kind in "biu":
      raise errors.InputError(
          f"{file}: tensor {name!r} has dtype {tensor.dtype}; model weights "
          "must be floating point.")
    return tensor, file

  def close(self):
    self._handles.clear()


def load_hf(path: str, *, dtype: str = "float32",
            shardings: Optional[Params] = None, scan_layers: bool = False,
            remat: str = "none") -> Tuple[config_lib.ModelConfig, Params]:
  """Loads a Hugging Face Qwen2 / Llama checkpoint directory.

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
  reader = _TensorReader(path)
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
  final = [os.path.join(path, _WEIGHTS_FILE), os.path.join(path, _CONFIG_FILE)]
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
