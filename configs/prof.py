"""PROF: PRM-consistency filtering before GRPO (Ye et al., 2509.03403).

    python -m experiments.train --config=configs/prof.py --workdir=runs/prof
    python -m experiments.train --config=configs/prof.py:source=oracle \\
        --workdir=runs/prof_oracle               # the step checker's labels
    python -m experiments.train --config=configs/prof.py:remove=2 \\
        --workdir=runs/prof_r2                   # drop 2 of every 8

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`); `source=oracle` reads the task's step checker instead and runs
sft -> rl. The verifier is the one PURE and TP-GRPO use (generative, on
progress labels). Per group of `rl.group_size`, the `remove` responses
whose step scores agree least with their outcome are dropped (balancing
correct and incorrect: see rl_rewards/runners/methods/prof.py) and GRPO
runs over the rest; `remove` defaults to half the group (the paper: 4 of
8). Watch `train/prof_kept_fraction` and `train/steps_per_response`.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress", source="model", remove=-1)
  config = config_lib.base_config()
  config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target=arg.target)
  config.rl.method = "prof"
  config.rl.advantage_estimator = "grpo"
  config = config_presets.apply_size(config, arg.size, regime=arg.regime)
  config.rl.prof.num_remove = (arg.remove if arg.remove >= 0 else
                               config.rl.group_size // 2)
  return config


def get_sweep():
  """How many responses of each group the filter drops."""
  return [{"rl.prof.num_remove": r} for r in (1, 2, 4)]
