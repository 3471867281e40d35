"""TP-GRPO: thought-level process rewards (He et al., 2507.23317).

    python -m experiments.train --config=configs/tp_grpo.py --workdir=runs/tp
    python -m experiments.train --config=configs/oracle.py:method=tp_grpo \\
        --workdir=runs/tp_oracle                 # the step checker's verdicts

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`). As in the paper the step judge is generative: by default the
policy fine-tuned as a generative step verifier on progress labels (the
verifier PURE uses). Its verdicts (P(correct) > 1/2) merge contiguous steps
into thoughts; a correct response's incorrect thoughts lose
alpha * (group accuracy), a wrong response's thoughts that do not lead to
its error lose nothing (see rl_rewards/runners/methods/tp_grpo.py).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress",
      alpha=1.0)
  config = config_lib.base_config()
  config_presets.use_trained_prm(config, sft=arg.sft, labels=arg.labels,
                                 prm=arg.prm, model=arg.model,
                                 target=arg.target)
  config.rl.method = "tp_grpo"
  config.rl.tp_grpo.alpha = arg.alpha
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  return [{"rl.tp_grpo.alpha": alpha} for alpha in (0.5, 1.0, 2.0)]
