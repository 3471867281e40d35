"""REINFORCE++ (Hu et al., 2501.03262), with or without the group baseline.

    python -m experiments.train --config=configs/reinforce_pp.py \\
        --workdir=runs/rpp                       # REINFORCE++
    python -m experiments.train --config=configs/reinforce_pp.py:baseline=group \\
        --workdir=runs/rpp_group                 # REINFORCE++-baseline

`baseline=none`: the token reward is the outcome on the last token minus
beta * KL(pi_old || pi_ref) (k1) on every token
(`rl.reinforce_pp.reward_kl_coef`, default here 0.01), gamma = 1 returns, whitened over every valid token of
the batch: no critic and no per-prompt baseline, so a group of one is
enough. `baseline=group`: the outcome minus the prompt's group mean, tiled
over the tokens and whitened over the batch (verl's REINFORCE++-baseline;
the KL, if any, is the loss term `rl.kl_coef`).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", baseline="none",
      kl=0.01)
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = "reinforce_pp"
  own = config.rl.reinforce_pp
  own.baseline = arg.baseline
  own.reward_kl_coef = arg.kl if arg.baseline == "none" else 0.0
  return config


def get_sweep():
  return [{"rl.reinforce_pp.baseline": b,
           "rl.reinforce_pp.reward_kl_coef": kl}
          for b, kl in (("none", 0.0), ("none", 0.01), ("group", 0.0))]
