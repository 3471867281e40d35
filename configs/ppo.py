"""PPO with a learned value model and GAE (token level).

    python -m experiments.train --config=configs/ppo.py --workdir=runs/ppo
    python -m experiments.train --config=configs/ppo.py:reward=prm \\
        --workdir=runs/ppo_prm                   # PRM step rewards
    python -m experiments.train \\
        --config=configs/ppo.py:reward=prm,source=oracle \\
        --workdir=runs/ppo_prm_oracle            # the step checker's labels

The value model is the policy's backbone with a fresh scalar head, trained
online with the clipped value loss (its own AdamW state is checkpointed with
the policy). Rewards: the 0/1 outcome on the last response token; advantages:
GAE(γ, λ), whitened over the batch. Expect slower early progress than GRPO
while the value model warms up.

`reward=prm` is step-by-step PPO with a process reward model (Math-Shepherd,
2312.08935): each step's score P(step correct) on its last token, plus the
outcome on the last token, then the same GAE and value model. The scores
come from a trained verifier (stages sft -> labels -> prm -> rl, reusable
with `labels=`, `prm=`; the one PURE uses) or, with `source=oracle`, from
the task's step checker.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", reward="outcome",
      labels="", prm="", model="generative", target="progress",
      source="model")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = "ppo"
  config.rl.gae_gamma = 1.0
  config.rl.ppo.gae_lambda = 0.95
  config.rl.ppo.value_learning_rate = 5e-4
  config.rl.ppo.reward = arg.reward
  if arg.reward == "prm":
    config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                   labels=arg.labels, prm=arg.prm,
                                   model=arg.model, target=arg.target)
  return config


def get_sweep():
  return [{"rl.ppo.gae_lambda": lam, "rl.ppo.value_learning_rate": lr}
          for lam in (0.95, 1.0) for lr in (1e-4, 5e-4)]
