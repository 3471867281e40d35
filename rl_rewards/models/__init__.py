"""One decoder (Qwen2, Qwen3, Llama, Mistral, Gemma 3) with LM and scalar
heads, as pure functions. docs/models.md lists the supported config.json keys.

Public API:
  ModelConfig, RopeScaling, preset, num_params       -- configuration
  init_params, init_from_backbone, param_logical_axes -- parameters
  stack_layers, unstack_layers                       -- per-layer <-> scanned
  apply, logits, token_logprobs, token_stats         -- forward passes
  TokenStats, DEFAULT_LOGITS_CHUNK                   -- the chunked LM head
  hidden_states, lm_head_kernel                      -- the trunk and LM head
  attention_masks                                    -- causal / sliding masks
  KVCache, init_cache, grow_cache, repeat_cache      -- incremental decoding
  load_hf, save_hf                                   -- Hugging Face checkpoints
"""

from rl_rewards.models.config import ModelConfig
from rl_rewards.models.config import RopeScaling
from rl_rewards.models.config import num_params
from rl_rewards.models.config import preset
from rl_rewards.models.hf import load_hf
from rl_rewards.models.hf import save_hf
from rl_rewards.models.model import abstract_params
from rl_rewards.models.lm_head import DEFAULT_CHUNK_SIZE as DEFAULT_LOGITS_CHUNK
from rl_rewards.models.lm_head import TokenStats
from rl_rewards.models.model import apply
from rl_rewards.models.model import attention_masks
from rl_rewards.models.model import default_positions
from rl_rewards.models.model import grow_cache
from rl_rewards.models.model import hidden_states
from rl_rewards.models.model import init_cache
from rl_rewards.models.model import init_from_backbone
from rl_rewards.models.model import init_params
from rl_rewards.models.model import KVCache
from rl_rewards.models.model import lm_head_kernel
from rl_rewards.models.model import logits
from rl_rewards.models.model import param_logical_axes
from rl_rewards.models.model import repeat_cache
from rl_rewards.models.model import stack_layers
from rl_rewards.models.model import token_logprobs
from rl_rewards.models.model import unstack_layers
from rl_rewards.models.model import token_stats
