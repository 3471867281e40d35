"""Multi-turn environments behind one host-side interface, batched over rows.

  BatchedEnv, BatchedStep, EnvStats, Env  -- `batched`: rows, limits, errors
  AnswerAttemptsEnv                       -- `reasoning_gym_env`

The embedded task with per-turn ground truth is
`rl_rewards.tasks.hidden_operands`; episodes are sampled by
`rl_rewards.rollout.episodes`. Nothing here imports JAX (pool workers import
this package).
"""

from rl_rewards.envs.batched import BatchedEnv
from rl_rewards.envs.batched import BatchedStep
from rl_rewards.envs.batched import Env
from rl_rewards.envs.batched import EnvStats
