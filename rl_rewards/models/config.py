"""Decoder hyperparameters: `ModelConfig` and the named size presets.

`ModelConfig` is a frozen (hashable) dataclass, so it can be passed to
`jax.jit` as a static argument. It describes one decoder in the same terms as
a Hugging Face `config.json` (see `models/hf.py` for the mapping): every
difference between the supported families (Qwen2, Qwen3, Llama, Mistral,
Gemma 3) is a field here -- q/k norms, RoPE scaling, sliding-window layers,
norm placement, the MLP activation, embedding and attention scales -- and the
decoder reads those fields, never the family name. Parameters are always
stored in float32; `dtype` is the activation (compute) dtype. `dtype`,
`scan_layers` and `remat` describe how the model is run, not the model: they
are not part of a Hugging Face config.json, and changing them never changes
the model's outputs beyond float rounding.
"""

import dataclasses
from typing import Optional, Tuple

ARCHITECTURES = ("qwen2", "qwen3", "llama", "mistral", "gemma3_text")
# Attention of one layer: over every earlier token, or over the last
# `sliding_window` slots only.
LAYER_TYPES = ("full", "sliding")
NORM_PLACEMENTS = ("pre", "sandwich")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
ROPE_TYPES = ("linear", "llama3", "yarn")
ACTIVATION_DTYPES = ("float32", "bfloat16")
HEAD_NAMES = ("lm", "score")
# What the backward pass of a decoder block keeps (see `ModelConfig.remat`).
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """How RoPE's inverse frequencies are rescaled for a longer context.

  The fields of a Hugging Face `rope_scaling` / `rope_parameters` entry, with
  its defaults resolved (`models/transformer.rope_frequencies` turns them
  into frequencies):

    linear: f_i / factor.
    llama3: f_i / factor for wavelengths 2π/f_i above
      original_max_position_embeddings / low_freq_factor, f_i below
      original_max_position_embeddings / high_freq_factor, and in between
      (1 − s) f_i / factor + s f_i with
      s = (original_max_position_embeddings · f_i / 2π − low_freq_factor) /
          (high_freq_factor − low_freq_factor).
    yarn: f_i / factor blended with f_i by a linear ramp over the dimensions
      between the correction range of beta_fast and beta_slow rotations, and
      cos / sin multiplied by `attention_factor` (default
      0.1 · ln(factor) + 1, or the ratio of the mscale / mscale_all_dim
      terms when both are given).

  Attributes:
    rope_type: "linear", "llama3" or "yarn".
    factor: context extension factor (> 0).
    low_freq_factor: llama3 only.
    high_freq_factor: llama3 only.
    original_max_position_embeddings: llama3 and yarn: the pretraining
      context.
    beta_fast: yarn only (default 32).
    beta_slow: yarn only (default 1).
    attention_factor: yarn only: the scale of cos and sin, resolved.
    truncate: yarn only: round the correction range to whole dimensions.
  """
  rope_type: str
  factor: float
  low_freq_factor: Optional[float] = None
  high_freq_factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float = 1.0
  truncate: bool = True

  def __post_init__(self):
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"RopeScaling.rope_type must be one of {ROPE_TYPES}, "
                       f"got {self.rope_type!r}.")
    if not self.factor > 0:
      raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor!r}.")
    needed = {"llama3": ("low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"),
              "yarn": ("original_max_position_embeddings",),
              "linear": ()}[self.rope_type]
    for name in needed:
      if getattr(self, name) is None:
        raise ValueError(f"RopeScaling.{name} is required for rope_type "
                         f"{self.rope_type!r}.")
    if (self.rope_type == "llama3" and
        self.high_freq_factor == self.low_freq_factor):
      raise ValueError("RopeScaling: llama3 needs high_freq_factor != "
                       f"low_freq_factor, both are {self.low_freq_factor}.")

  def replace(self, **changes) -> "RopeScaling":
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and numerics of the decoder.

  Attributes:
    vocab_size: V, number of token ids.
    hidden_size: D, the residual-stream width.
    num_layers: number of decoder blocks.
    num_heads: H, query heads.
    num_kv_heads: KVH, key/value heads (grouped-query attention); must divide
      `num_heads`.
    head_dim: Dh, per-head width (need not equal D / H).
    intermediate_size: F, SwiGLU hidden width.
    rope_theta: RoPE base frequency (of the full-attention layers).
    rms_norm_eps: epsilon inside RMSNorm's rsqrt.
    tie_word_embeddings: if True the LM head reuses the embedding matrix.
    attention_bias: q/k/v projections carry a bias (Qwen2: True; Llama,
      Qwen3, Mistral, Gemma 3: False). The output projection never has one.
    max_position_embeddings: longest sequence (prompt + generation, in slots)
      the model is used with.
    dtype: activation dtype, "float32" or "bfloat16". Parameters stay float32.
    architecture: the Hugging Face `model_type` written by `save_hf` (one of
      `ARCHITECTURES`). Only `models/hf.py` reads it; the decoder does not.
    scan_layers: run the blocks under one `nn.scan`, with every block
      parameter stacked on a leading layers axis (`params["layers"]`, [L, ...])
      instead of one subtree per block (`params["layers_{i}"]`). Compile time
      and program size then no longer grow with depth. `stack_layers` /
      `unstack_layers` convert between the two layouts.
    remat: what a block keeps for the backward pass: "none" (everything),
      "full" (only its input; the block is recomputed) or "dots" (its
      projection and MLP matmul outputs; the attention scores and the
      elementwise work are recomputed).
    rope_scaling: None (plain RoPE) or the `RopeScaling` of the
      full-attention layers (and of sliding ones when `local_rope_theta` is
      None).
    qk_norm: RMSNorm of every query and key head over Dh (its own [Dh]
      scales, `q_norm` / `k_norm`) after the projections, before RoPE (Qwen3,
      Gemma 3).
    layer_types: None (every layer "full") or one of `LAYER_TYPES` per
      layer. A "sliding" layer lets the query in slot t attend to key slot s
      only when t − s < `sliding_window` (on top of the causal and padding
      masks).
    sliding_window: window W of the sliding layers, in slots (set to None
      when no layer slides). `layer_types` with no sliding layer is stored
      as None.
    local_rope_theta: RoPE base of the sliding layers (Gemma 3's
      `rope_local_base_freq`; plain RoPE, no scaling); None: they use
      `rope_theta` and `rope_scaling` as the full layers do.
    norm_placement: "pre" (x + f(norm(x)) for attention and MLP) or
      "sandwich" (Gemma 3: x + post_norm(f(pre_norm(x))) for both).
    rms_scale_offset: RMSNorm multiplies by (offset + w) (Gemma 3: 1, the
      stored w is centred on 0). With an offset the product is taken in
      float32 before casting, as Gemma does.
    mlp_activation: gate activation of the gated MLP, "silu" or
      "gelu_tanh" (GELU, tanh approximation).
    embed_scale: the embeddings are multiplied by this (Gemma 3: √D, rounded
      to the activation dtype).
    query_pre_attn_scalar: None (attention scale 1/√Dh) or s (scale
      s^-1/2, Gemma 3).
  """
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  rope_theta: float = 10_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = True
  max_position_embeddings: int = 2048
  dtype: str = "float32"
  architecture: str = "qwen2"
  scan_layers: bool = False
  remat: str = "none"
  rope_scaling: Optional[RopeScaling] = None
  qk_norm: bool = False
  layer_types: Optional[Tuple[str, ...]] = None
  sliding_window: Optional[int] = None
  local_rope_theta: Optional[float] = None
  norm_placement: str = "pre"
  rms_scale_offset: float = 0.0
  mlp_activation: str = "silu"
  embed_scale: float = 1.0
  query_pre_attn_scalar: Optional[float] = None

  def __post_init__(self):
    positive_ints = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "intermediate_size",
                     "max_position_embeddings")
    for name in positive_ints:
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"ModelConfig.{name} must be a positive int, got {value!r}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
          f"num_kv_heads ({self.num_kv_heads}).")
    if self.head_dim % 2:
      raise ValueError(
          f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}.")
    if not self.rope_theta > 0:
      raise ValueError(
          f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}.")
    if not self.rms_norm_eps > 0:
      raise ValueError(
          f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}.")
    if self.dtype not in ACTIVATION_DTYPES:
      raise ValueError(
          f"ModelConfig.dtype must be one of {ACTIVATION_DTYPES}, got "
          f"{self.dtype!r}.")
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f"ModelConfig.architecture must be one of {ARCHITECTURES}, got "
          f"{self.architecture!r}.")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(
          f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(
          f"ModelConfig.remat must be one of {REMAT_POLICIES} (\"none\": keep "
          "all activations, \"full\": recompute each block, \"dots\": keep "
          f"only matmul outputs), got {self.remat!r}.")
    if not (self.rope_scaling is None or
            isinstance(self.rope_scaling, RopeScaling)):
      raise ValueError("ModelConfig.rope_scaling must be None or a "
                       f"RopeScaling, got {self.rope_scaling!r}.")
    if self.layer_types is not None:
      if isinstance(self.layer_types, list):  # Keep the config hashable.
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if (not isinstance(self.layer_types, tuple) or
          len(self.layer_types) != self.num_layers or
          any(t not in LAYER_TYPES for t in self.layer_types)):
        raise ValueError(
            f"ModelConfig.layer_types must be None or {self.num_layers} "
            f"entries from {LAYER_TYPES}, got {self.layer_types!r}.")
      if "sliding" not in self.layer_types:  # One spelling of all-full.
        object.__setattr__(self, "layer_types", None)
    if self.sliding_window is not None and (
        isinstance(self.sliding_window, bool) or
        not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
      raise ValueError("ModelConfig.sliding_window must be None or a "
                       f"positive int, got {self.sliding_window!r}.")
    if "sliding" in self.layer_kinds and self.sliding_window is None:
      raise ValueError("ModelConfig.layer_types has sliding layers but "
                       "sliding_window is None.")
    if "sliding" not in self.layer_kinds:  # No layer reads it.
      object.__setattr__(self, "sliding_window", None)
    if self.local_rope_theta is not None and not self.local_rope_theta > 0:
      raise ValueError("ModelConfig.local_rope_theta must be None or > 0, "
                       f"got {self.local_rope_theta!r}.")
    if self.norm_placement not in NORM_PLACEMENTS:
      raise ValueError(f"ModelConfig.norm_placement must be one of "
                       f"{NORM_PLACEMENTS}, got {self.norm_placement!r}.")
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ValueError(f"ModelConfig.mlp_activation must be one of "
                       f"{MLP_ACTIVATIONS}, got {self.mlp_activation!r}.")
    if not self.embed_scale > 0:
      raise ValueError(f"ModelConfig.embed_scale must be > 0, got "
                       f"{self.embed_scale!r}.")
    if (self.query_pre_attn_scalar is not None and
        not self.query_pre_attn_scalar > 0):
      raise ValueError("ModelConfig.query_pre_attn_scalar must be None or "
                       f"> 0, got {self.query_pre_attn_scalar!r}.")

  @property
  def layer_kinds(self) -> Tuple[str, ...]:
    """The attention type of each layer ("full" / "sliding"), L entries."""
    if self.layer_types is None:
      return ("full",) * self.num_layers
    return self.layer_types

  @property
  def attention_kinds(self) -> Tuple[str, ...]:
    """The distinct layer types in use, in `LAYER_TYPES` order."""
    return tuple(t for t in LAYER_TYPES if t in self.layer_kinds)

  def rope_for(self, kind: str) -> Tuple[float, Optional[RopeScaling]]:
    """(RoPE base, scaling) of the layers of type `kind`."""
    if kind == "sliding" and self.local_rope_theta is not None:
      return self.local_rope_theta, None
    return self.rope_theta, self.rope_scaling

  @property
  def num_query_groups(self) -> int:
    """Query heads per key/value head (H / KVH)."""
    return self.num_heads // self.num_kv_heads

  def replace(self, **changes) -> "ModelConfig":
    """A copy with `changes` applied (validated again)."""
    return dataclasses.replace(self, **changes)


def _test_size(vocab_size):
  # Unit tests: compiles in about a second.
  return ModelConfig(
      vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=8, intermediate_size=64, rope_theta=10_000.0,
      max_position_embeddings=256)


def _tiny_size(vocab_size):
  # The CPU default job: about 0.4 M parameters with a ~20-token vocabulary.
  return ModelConfig(
      vocab_size=vocab_size, hidden_size=128, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=32, intermediate_size=384, rope_theta=10_000.0,
      max_position_embeddings=512)


def _small_size(vocab_size):
  # Benchmarks: about 41 M parameters without the embeddings.
  return ModelConfig(
      vocab_size=vocab_size, hidden_size=512, num_layers=8, num_heads=8,
      num_kv_heads=4, head_dim=64, intermediate_size=2816,
      rope_theta=1_000_000.0, max_position_embeddings=4096)


_PRESETS = {
    "test": _test_size,
    "tiny": _tiny_size,
    "small": _small_size,
}


def preset(name: str, vocab_size: int, **overrides) -> ModelConfig:
  """A named size ("test", "tiny" or "small") for a given vocabulary.

  Args:
    name: preset name.
    vocab_size: V.
    **overrides: any `ModelConfig` field to change (e.g. `dtype="bfloat16"`).

  Returns:
    The validated `ModelConfig`.
  """
  if name not in _PRESETS:
    raise ValueError(
        f"Unknown model preset {name!r}; expected one of {sorted(_PRESETS)}.")
  return _PRESETS[name](vocab_size).replace(**overrides)


def num_params(cfg: ModelConfig, heads=("lm",)) -> int:
  """Parameter count of `init_params(cfg, rng, heads=heads)`."""
  d, f = cfg.hidden_size, cfg.intermediate_size
  q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  attention = d * q_out + 2 * d * kv_out + q_out * d
  if cfg.attention_bias:
    attention += q_out + 2 * kv_out
  if cfg.qk_norm:
    attention += 2 * cfg.head_dim
  norms = 4 if cfg.norm_placement == "sandwich" else 2
  block = attention + 3 * d * f + norms * d
  total = cfg.vocab_size * d + cfg.num_layers * block + d
  if "lm" in heads and not cfg.tie_word_embeddings:
    total += d * cfg.vocab_size
  if "score" in heads:
    total += d + 1
  return total
