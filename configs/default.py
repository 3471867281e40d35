"""The default job: SFT warm start, then GRPO, on the arithmetic task (CPU).

    python -m experiments.train                       # this config, runs/default
    python -m experiments.train --config=configs/default.py --workdir=runs/x \
        --config.rl.steps=100 --config.seed=1

What to expect on 2 CPU cores: a tiny Qwen2-style policy (~0.4 M parameters)
learns the fixed-width arithmetic format by SFT until a quick held-out gate
reaches the target accuracy, then outcome-reward GRPO (32 prompts x 8
samples, PPO-clip, no KL) raises held-out greedy accuracy; the whole job
finishes in under 10 minutes and prints accuracy before and after RL.
`get_config("size=test")` shrinks everything for tests.
"""

from rl_rewards import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny")
  config = config_lib.base_config()
  config.model.size = arg.size
  if arg.size == "test":
    config.task.max_ops = 3
    config.task.max_new_tokens = 48
    config.sft.batch_size = 16
    config.sft.max_steps = 4
    config.sft.gate_every_steps = 2
    config.sft.gate_eval_size = 16
    config.sft.log_every_steps = 1
    config.sft.checkpoint_every_steps = 2
    config.rl.steps = 2
    config.rl.prompts_per_step = 8
    config.rl.group_size = 2
    config.rl.eval_every_steps = 1
    config.rl.checkpoint_every_steps = 1
    config.eval.size_per_k = 8
    config.eval.batch_size = 32
    config.eval.pass_size = 16
    config.eval.pass_n = 2
  return config
