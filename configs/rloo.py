"""RLOO: leave-one-out baseline on the outcome (Ahmadian et al.).

    python -m experiments.train --config=configs/rloo.py --workdir=runs/rloo

A_i = r_i − mean_{j≠i} r_j on every response token; PPO-clip, token-mean.
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
  config.rl.advantage_estimator = "rloo"
  return config


def get_sweep():
  return [{"rl.learning_rate": lr} for lr in (2.5e-5, 5e-5, 1e-4)]
