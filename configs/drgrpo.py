"""Dr. GRPO: GRPO without the std and length normalisations (Liu et al.).

    python -m experiments.train --config=configs/drgrpo.py --workdir=runs/drgrpo

Advantage r − mean(r) (no division by the group std) and the
`seq-mean-token-sum-norm` loss (token losses summed and divided by a constant,
the response length budget), removing the bias toward long wrong answers.
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
  config.rl.advantage_estimator = "drgrpo"
  config.rl.loss_agg_mode = "seq-mean-token-sum-norm"
  return config


def get_sweep():
  return [{"rl.learning_rate": lr} for lr in (2.5e-5, 5e-5, 1e-4)]
