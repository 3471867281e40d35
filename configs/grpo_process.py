"""GRPO with process supervision (DeepSeekMath §4.1.3, 2402.03300).

    python -m experiments.train --config=configs/grpo_process.py \\
        --workdir=runs/grpo_process

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`). Every step score of the verifier (by default the generative
progress verifier PURE uses) is normalised over all step scores of the
prompt's group, and each token gets the sum of the normalised scores of its
step and the later ones (sum-form, gamma = 1), plus the outcome's group
advantage: the sum-form baseline that PURE's min-form argues against.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress", coef=1.0)
  config = config_lib.base_config()
  config_presets.use_trained_prm(config, sft=arg.sft, labels=arg.labels,
                                 prm=arg.prm, model=arg.model,
                                 target=arg.target)
  config.rl.method = "grpo_process"
  config.rl.process_coef = arg.coef
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  return [{"rl.process_coef": coef} for coef in (0.5, 1.0, 2.0)]
