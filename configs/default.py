"""The default job: SFT warm start, then GRPO, on the arithmetic task (CPU).

    python -m experiments.train                       # this config, runs/default
    python -m experiments.train --config=configs/default.py --workdir=runs/x \\
        --config.rl.steps=100 --config.seed=1

What to expect on 2 CPU cores: a tiny Qwen2-style policy (~0.4 M parameters)
learns the fixed-width arithmetic format by SFT until a quick held-out gate
reaches the target accuracy, then outcome-reward GRPO (32 prompts x 8
samples, PPO-clip, no KL) raises held-out greedy accuracy; the whole job
finishes in under 10 minutes and prints accuracy before and after RL.
`--config=configs/default.py:size=test` shrinks everything for smoke tests.
"""

from rl_rewards import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny")
  config = config_lib.base_config()
  return config_lib.apply_size(config, arg.size)
