"""IGPO: information-gain turn rewards on multi-turn episodes (2510.14967).

    python -m experiments.train --config=configs/igpo.py --workdir=runs/igpo
    python -m experiments.train --config=configs/igpo.py:norm=separate \\
        --workdir=runs/igpo_separate       # outcomes and gains z-scored apart
    python -m experiments.train --config=configs/igpo.py:size=test \\
        --workdir=/tmp/igpo                             # a smoke run

The hidden-operands task (configs/multiturn.py), sft -> rl. After each
rollout, the answer probe appends the true answer turn ("#015" and the end
of turn) after the prompt and after every turn with its tool observation,
and reads the policy's probability of it, P = exp(mean token log-prob).
Each turn earns the gain of P it made; the answer turn earns the outcome
reward. The rewards are z-scored within each prompt's group (`norm`:
joint, or separate for outcomes and gains), summed from each turn on with
discount `gamma` (default 1, the released code's), and put on the turn's
tokens (rl_rewards/runners/methods/igpo.py). Arguments: `size`, `regime`,
`sft` (reuse a finished run's SFT policy), `gamma`, `norm`,
`distractors`.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny", regime="standard", sft="",
                             gamma=1.0, norm="joint", distractors=0)
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config_presets.use_multiturn_task(config, arg.distractors)
  config.sft.init_from = arg.sft
  config.rl.method = "igpo"
  config.rl.advantage_estimator = "grpo"  # The outcome part of the logs.
  config.rl.igpo.gamma = arg.gamma
  config.rl.igpo.norm = arg.norm
  return config


def get_sweep():
  return [{"rl.igpo.gamma": gamma, "rl.igpo.norm": norm}
          for gamma in (0.9, 1.0) for norm in ("joint", "separate")]
