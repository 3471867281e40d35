"""G-RA: gated reward accumulation on multi-turn episodes (arXiv 2508.10548).

    python -m experiments.train --config=configs/gra.py --workdir=runs/gra
    python -m experiments.train --config=configs/gra.py:size=test \\
        --workdir=/tmp/gra                             # a smoke run

The hidden-operands task (configs/multiturn.py): each turn that makes
progress (the task's per-turn oracle label) earns an immediate reward β =
`beta`, but only in episodes whose outcome reward reaches the gate Δ =
`threshold` (default 1: a right final answer); the advantage of a turn's
tokens is the gated return from that turn, r + 1[r ≥ Δ]·β·Σ_{j≥k} label_j,
minus the group mean of the episodes' gated returns
(rl_rewards/runners/methods/gra.py). `beta=0` is outcome-only Dr. GRPO.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny", regime="standard", sft="",
                             beta=0.1, threshold=1.0, distractors=0)
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config_presets.use_multiturn_task(config, arg.distractors)
  config.sft.init_from = arg.sft
  config.rl.method = "gra"
  config.rl.advantage_estimator = "drgrpo"
  config.rl.gra.turn_reward = arg.beta
  config.rl.gra.threshold = arg.threshold
  return config


def get_sweep():
  return [{"rl.gra.turn_reward": beta} for beta in (0.05, 0.1, 0.2)]
