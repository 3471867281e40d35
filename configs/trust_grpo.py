"""Trust-GRPO: an annealed, trust-weighted thinking reward (SophiaVL-R1,
Fan et al., 2505.17018).

    python -m experiments.train --config=configs/trust_grpo.py \\
        --workdir=runs/trust_grpo
    python -m experiments.train --config=configs/trust_grpo.py:source=oracle \\
        --workdir=runs/trust_oracle              # the step checker's labels

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`); `source=oracle` reads the task's step checker instead. The reward
is the outcome plus w times the mean of the verifier's step scores, with
w = `weight` * exp(-step / `anneal`) shrunk in a group whose wrong
responses score higher than its right ones (see
rl_rewards/runners/methods/trust_grpo.py); GRPO on that reward. Watch
`train/trust_weight_scale`. With the 0/1 outcome of the arithmetic task
the group trust factor is always 1 (wrong answers are never judged).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress", source="model", weight=0.3,
      anneal=500.0)
  config = config_lib.base_config()
  config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target=arg.target)
  config.rl.method = "trust_grpo"
  config.rl.advantage_estimator = "grpo"
  config.rl.trust_grpo.base_weight = arg.weight
  config.rl.trust_grpo.anneal_steps = arg.anneal
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  return [{"rl.trust_grpo.base_weight": w, "rl.trust_grpo.anneal_steps": t}
          for w in (0.3, 1.0) for t in (100.0, 500.0)]
