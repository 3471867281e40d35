"""Jitted sampling with a KV cache: tokens, log-probs, masks and step ids."""

from rl_rewards.rollout.sampler import sample
from rl_rewards.rollout.sampler import SampleOutput
from rl_rewards.rollout.sampler import top_p_logits
