"""FAPO: a correct answer reached through a wrong step is a flawed positive.

    python -m experiments.train --config=configs/fapo.py --workdir=runs/fapo
    python -m experiments.train --config=configs/fapo.py:source=oracle \\
        --workdir=runs/fapo_oracle               # the step checker as critic

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`; `source=oracle` runs sft -> rl). The critic is by default the
policy fine-tuned as a generative step verifier on progress labels (the one
PURE and TP-GRPO use), standing in for FAPO's generative critic; a response
is flawed when a step scores below `threshold`. A correct flawed response
gets +1 - penalty (0 by default, as FAPO's code), a correct clean one +1,
an incorrect one -1; then GRPO (rl_rewards/runners/methods/fapo.py). Watch
`train/advantage_var_process`: the share of the signal the penalty adds.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      source="model", model="generative", target="progress",
      penalty=1.0, threshold=0.5)
  config = config_lib.base_config()
  config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target=arg.target)
  config.rl.method = "fapo"
  config.rl.fapo.penalty = arg.penalty
  config.rl.fapo.threshold = arg.threshold
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """The penalty of a flawed positive (1: scored 0, as FAPO's code)."""
  return [{"rl.fapo.penalty": penalty} for penalty in (0.5, 1.0, 2.0)]
