"""Oracle process reward: the task's step checker as a perfect prover (PAV).

    python -m experiments.train --config=configs/oracle.py --workdir=runs/oracle

The upper bound for process-reward credit assignment on the arithmetic task:
Q of a perfect prover is 1 until the first wrong step and 0 after, so the
PAV effective reward A_out + α·(Q_k − Q_{k−1}) puts −α exactly on the first
mistake. `:method=pure` uses the same oracle labels (+1/−1) as PURE's PRM.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", method="pav")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = arg.method
  config.rl.prm_source = "oracle"
  if arg.method == "pav":
    config.rl.advantage_estimator = "drgrpo"  # PAV's Eq. 5 (methods/pav.py).
  config.rl.pav.alpha = 1.0
  config.rl.pav.prover_k = 1
  return config


def get_sweep():
  return [{"rl.pav.alpha": alpha} for alpha in (0.5, 1.0, 2.0)]
