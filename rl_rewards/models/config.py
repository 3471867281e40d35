"""Decoder hyperparameters: `ModelConfig` and the named size presets.

`ModelConfig` is a frozen (hashable) dataclass, so it can be passed to
`jax.jit` as a static argument. It describes a Qwen2/Llama-style decoder in the
same terms as a Hugging Face `config.json` (see `models/hf.py` for the
mapping). Parameters are always stored in float32; `dtype` is the activation
(compute) dtype. `dtype`, `scan_layers` and `remat` describe how the model is
run, not the model: they are not part of a Hugging Face config.json, and
changing them never changes the model's outputs beyond float rounding.
"""

import dataclasses

ARCHITECTURES = ("qwen2", "llama")
ACTIVATION_DTYPES = ("float32", "bfloat16")
HEAD_NAMES = ("lm", "score")
# What the backward pass of a decoder block keeps (see `ModelConfig.remat`).
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and numerics of a Qwen2/Llama decoder.

  Attributes:
    vocab_size: V, number of token ids.
    hidden_size: D, the residual-stream width.
    num_layers: number of decoder blocks.
    num_heads: H, query heads.
    num_kv_heads: KVH, key/value heads (grouped-query attention); must divide
      `num_heads`.
    head_dim: Dh, per-head width (need not equal D / H).
    intermediate_size: F, SwiGLU hidden width.
    rope_theta: RoPE base frequency.
    rms_norm_eps: epsilon inside RMSNorm's rsqrt.
    tie_word_embeddings: if True the LM head reuses the embedding matrix.
    attention_bias: q/k/v projections carry a bias (Qwen2: True; Llama:
      False). The output projection never has one.
    max_position_embeddings: longest sequence (prompt + generation, in slots)
      the model is used with.
    dtype: activation dtype, "float32" or "bfloat16". Parameters stay float32.
    architecture: "qwen2" or "llama"; decides the Hugging Face `model_type`
      written by `save_hf`.
    scan_layers: run the blocks under one `nn.scan`, with every block
      parameter stacked on a leading layers axis (`params["layers"]`, [L, ...])
      instead of one subtree per block (`params["layers_{i}"]`). Compile time
      and program size then no longer grow with depth. `stack_layers` /
      `unstack_layers` convert between the two layouts.
    remat: what a block keeps for the backward pass: "none" (everything),
      "full" (only its input; the block is recomputed) or "dots" (its
      projection and MLP matmul outputs; the attention scores and the
      elementwise work are recomputed).
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
  block = attention + 3 * d * f + 2 * d
  total = cfg.vocab_size * d + cfg.num_layers * block + d
  if "lm" in heads and not cfg.tie_word_embeddings:
    total += d * cfg.vocab_size
  if "score" in heads:
    total += d + 1
  return total
