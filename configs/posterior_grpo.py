"""Posterior-GRPO: a thinking reward only for correct responses (Fan et
al., 2508.05170).

    python -m experiments.train --config=configs/posterior_grpo.py \\
        --workdir=runs/posterior_grpo
    python -m experiments.train \\
        --config=configs/posterior_grpo.py:source=oracle \\
        --workdir=runs/posterior_oracle          # the step checker's labels

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`); `source=oracle` reads the task's step checker instead. The reward
is the outcome plus, for a correct response only, `coef` times the mean of
the verifier's step scores; GRPO on that reward. A wrong response earns
nothing from the verifier, so the verifier cannot pay for a wrong answer.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress", source="model", coef=1.0)
  config = config_lib.base_config()
  config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target=arg.target)
  config.rl.method = "posterior_grpo"
  config.rl.advantage_estimator = "grpo"
  config.rl.posterior_grpo.thinking_coef = arg.coef
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  return [{"rl.posterior_grpo.thinking_coef": c} for c in (0.5, 1.0, 2.0)]
