"""The logical-axis vocabulary shared by models, sharding rules and configs.

Parameters and activations are annotated with these *logical* names; one rules
table (`DEFAULT_RULES`, overridable from the config) maps them to the physical
mesh axes `('data', 'fsdp', 'tensor')`. Strings only, so that model code can
import this module without pulling in any mesh machinery.
"""

# Physical mesh axes.
DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
MESH_AXES = (DATA, FSDP, TENSOR)

# Parameter axes.
VOCAB = "vocab"          # Embedding / LM-head vocabulary dimension.
EMBED = "embed"          # Model width (hidden size).
MLP = "mlp"              # Feed-forward hidden dimension.
HEADS = "heads"          # Query heads.
KV_HEADS = "kv_heads"    # Key/value heads (grouped-query attention).
HEAD_DIM = "head_dim"    # Per-head feature dimension.
NORM = "norm"            # RMSNorm scale vectors.
SCALAR = "scalar"        # Size-1 output of a value / step-score head.
LAYERS = "layers"        # Leading axis of scanned (stacked) block parameters.

# Activation axes.
ACT_BATCH = "act_batch"
ACT_LENGTH = "act_length"
ACT_EMBED = "act_embed"
ACT_HEADS = "act_heads"
ACT_KV_HEADS = "act_kv_heads"
ACT_MLP = "act_mlp"
ACT_VOCAB = "act_vocab"

# logical name -> mesh axis (or tuple of axes, or None for replicated).
DEFAULT_RULES = (
    (ACT_BATCH, (DATA, FSDP)),
    (ACT_LENGTH, None),
    (ACT_EMBED, None),
    (ACT_HEADS, TENSOR),
    (ACT_KV_HEADS, TENSOR),
    (ACT_MLP, TENSOR),
    (ACT_VOCAB, TENSOR),
    (VOCAB, TENSOR),
    (EMBED, FSDP),
    (MLP, TENSOR),
    (HEADS, TENSOR),
    (KV_HEADS, TENSOR),
    (HEAD_DIM, None),
    (NORM, None),
    (SCALAR, None),
    (LAYERS, None),
)
