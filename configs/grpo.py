"""GRPO: the outcome-reward baseline (DeepSeekMath §4.1).

    python -m experiments.train --config=configs/grpo.py --workdir=runs/grpo
    python -m experiments.train --config=configs/grpo.py:sft=runs/default \\
        --workdir=runs/grpo            # reuse a finished SFT policy

Advantages are the group z-score of the 0/1 outcome, (r − mean)/(std + ε)
with the unbiased group std, on every response token; PPO-clip with a
token-mean loss and no KL. Expect held-out accuracy to rise by several points
over the SFT policy in 75 steps on the arithmetic task (2 CPU cores: ~3 min).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = "outcome"
  config.rl.advantage_estimator = "grpo"
  return config


def get_sweep():
  """Learning-rate grid (`python -m experiments.sweep --config=...`)."""
  return [{"rl.learning_rate": lr} for lr in (2.5e-5, 5e-5, 1e-4)]
