"""Credit assignment for RL of language-model reasoning, as pure jax functions.

Every function takes batch-first arrays and returns arrays: token arrays are
[B, T] with a `response_mask`, step arrays [B, S] with a `step_mask`, and
`step_ids` [B, T] (−1 on prompt/padding) links the two. No state, no config
objects, no Python loops over time; everything is jittable with static
shapes and never returns NaN on degenerate batches (zero-variance groups,
groups of one, empty or all-padding rows).

Modules: `masking` (masked statistics), `segments` (token <-> step),
`returns` (discounted returns, GAE, min-form), `advantages` (group baselines,
REINFORCE++, GRPO with process supervision), `process` (PAV progress,
Clip/Delta, thought merging), `pure` (PURE), `prime` (PRIME, implicit PRM),
`losses` (PPO policy/value losses, KL, aggregation, implicit-PRM losses),
`thoughts` (TP-GRPO thought-level, capability-adaptive process rewards),
`filters` (PROF consistency filtering), `gated_rewards` (Posterior-GRPO,
Trust-GRPO), `critiques` (CAPO, FAPO), `mrt` (MRT progress bonus).
"""

from rl_rewards.core.advantages import grpo_process_advantages
from rl_rewards.core.advantages import process_ppo_advantages
from rl_rewards.core.advantages import process_token_rewards
from rl_rewards.core.advantages import group_advantages
from rl_rewards.core.advantages import group_reduce
from rl_rewards.core.advantages import group_statistics
from rl_rewards.core.advantages import reinforce_plus_plus
from rl_rewards.core.advantages import reinforce_plus_plus_baseline
from rl_rewards.core.critiques import capo_token_rewards
from rl_rewards.core.critiques import fapo_rewards
from rl_rewards.core.critiques import sample_critiques
from rl_rewards.core.critiques import vote_wrong_steps
from rl_rewards.core.filters import kept_group_advantages
from rl_rewards.core.filters import prof_keep_mask
from rl_rewards.core.filters import prof_scores
from rl_rewards.core.gated_rewards import posterior_rewards
from rl_rewards.core.gated_rewards import trust_weighted_rewards
from rl_rewards.core.igpo import igpo_advantages
from rl_rewards.core.losses import aggregate_loss
from rl_rewards.core.losses import clipped_surrogate_loss
from rl_rewards.core.losses import implicit_prm_ce_loss
from rl_rewards.core.losses import implicit_prm_ce_row_losses
from rl_rewards.core.losses import implicit_prm_dpo_loss
from rl_rewards.core.losses import implicit_prm_group_accuracies
from rl_rewards.core.losses import implicit_prm_pairwise_accuracy
from rl_rewards.core.losses import kl_divergence
from rl_rewards.core.losses import LOSS_AGG_MODES
from rl_rewards.core.losses import policy_loss
from rl_rewards.core.losses import value_loss
from rl_rewards.core.masking import masked_count
from rl_rewards.core.masking import masked_mean
from rl_rewards.core.masking import masked_sum
from rl_rewards.core.masking import masked_var
from rl_rewards.core.masking import masked_whiten
from rl_rewards.core.mrt import mrt_advantages
from rl_rewards.core.mrt import mrt_progress
from rl_rewards.core.mrt import termination_advantages
from rl_rewards.core.prime import implicit_q_values
from rl_rewards.core.prime import implicit_step_rewards
from rl_rewards.core.prime import implicit_token_rewards
from rl_rewards.core.prime import prime_advantages
from rl_rewards.core.prime import prime_batch_norm
from rl_rewards.core.prime import prime_rloo
from rl_rewards.core.process import aggregate_step_scores
from rl_rewards.core.process import best_of_k
from rl_rewards.core.process import clip_step_rewards
from rl_rewards.core.process import delta_step_rewards
from rl_rewards.core.process import effective_step_rewards
from rl_rewards.core.process import merge_steps_by_label
from rl_rewards.core.process import pav_advantages
from rl_rewards.core.process import progress
from rl_rewards.core.pure import mask_step_end_tokens
from rl_rewards.core.pure import min_form_step_rewards
from rl_rewards.core.pure import pure_advantages
from rl_rewards.core.pure import pure_normalize
from rl_rewards.core.pure import pure_rloo_step_rewards
from rl_rewards.core.pure import softmin_step_rewards
from rl_rewards.core.returns import discounted_returns
from rl_rewards.core.returns import gae
from rl_rewards.core.returns import min_form_returns
from rl_rewards.core.returns import reward_to_go
from rl_rewards.core.returns import step_returns
from rl_rewards.core.returns import token_min_form_returns
from rl_rewards.core import spa
from rl_rewards.core.segments import broadcast_to_tokens
from rl_rewards.core.segments import last_valid_index
from rl_rewards.core.segments import num_steps_per_row
from rl_rewards.core.segments import outcome_token_rewards
from rl_rewards.core.segments import step_end_mask_from_ids
from rl_rewards.core.segments import step_ids_from_step_ends
from rl_rewards.core.segments import step_mask_from_ids
from rl_rewards.core.segments import step_token_counts
from rl_rewards.core.segments import steps_to_end_tokens
from rl_rewards.core.segments import steps_to_tokens
from rl_rewards.core.segments import tokens_to_steps
from rl_rewards.core.thoughts import capability_adaptive_weight
from rl_rewards.core.thoughts import group_accuracy
from rl_rewards.core.thoughts import segment_thoughts
from rl_rewards.core.thoughts import thought_rewards
from rl_rewards.core.thoughts import Thoughts
from rl_rewards.core.thoughts import tp_grpo_advantages

__all__ = (
    "aggregate_loss",
    "aggregate_step_scores",
    "best_of_k",
    "broadcast_to_tokens",
    "capability_adaptive_weight",
    "capo_token_rewards",
    "clip_step_rewards",
    "clipped_surrogate_loss",
    "delta_step_rewards",
    "discounted_returns",
    "effective_step_rewards",
    "fapo_rewards",
    "gae",
    "group_accuracy",
    "group_advantages",
    "group_reduce",
    "group_statistics",
    "igpo_advantages",
    "grpo_process_advantages",
    "implicit_prm_ce_loss",
    "implicit_prm_ce_row_losses",
    "implicit_prm_dpo_loss",
    "implicit_prm_group_accuracies",
    "implicit_prm_pairwise_accuracy",
    "implicit_q_values",
    "implicit_step_rewards",
    "implicit_token_rewards",
    "kept_group_advantages",
    "kl_divergence",
    "last_valid_index",
    "LOSS_AGG_MODES",
    "mask_step_end_tokens",
    "masked_count",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "merge_steps_by_label",
    "min_form_returns",
    "min_form_step_rewards",
    "mrt_advantages",
    "mrt_progress",
    "num_steps_per_row",
    "outcome_token_rewards",
    "pav_advantages",
    "policy_loss",
    "posterior_rewards",
    "prime_advantages",
    "prime_batch_norm",
    "prime_rloo",
    "process_ppo_advantages",
    "process_token_rewards",
    "prof_keep_mask",
    "prof_scores",
    "progress",
    "pure_advantages",
    "pure_normalize",
    "pure_rloo_step_rewards",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "reward_to_go",
    "segment_thoughts",
    "softmin_step_rewards",
    "step_end_mask_from_ids",
    "step_ids_from_step_ends",
    "step_mask_from_ids",
    "step_returns",
    "step_token_counts",
    "steps_to_end_tokens",
    "steps_to_tokens",
    "termination_advantages",
    "thought_rewards",
    "Thoughts",
    "token_min_form_returns",
    "tokens_to_steps",
    "tp_grpo_advantages",
    "trust_weighted_rewards",
    "value_loss",
    "sample_critiques",
    "vote_wrong_steps",
)
