"""PPO with a learned value model and GAE (token level).

    python -m experiments.train --config=configs/ppo.py --workdir=runs/ppo

The value model is the policy's backbone with a fresh scalar head, trained
online with the clipped value loss (its own AdamW state is checkpointed with
the policy). Rewards: the 0/1 outcome on the last response token; advantages:
GAE(γ, λ), whitened over the batch. Expect slower early progress than GRPO
while the value model warms up.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                 regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = "ppo"
  config.rl.gae_gamma = 1.0
  config.rl.ppo.gae_lambda = 0.95
  config.rl.ppo.value_learning_rate = 5e-4
  return config


def get_sweep():
  return [{"rl.ppo.gae_lambda": lam, "rl.ppo.value_learning_rate": lr}
          for lam in (0.95, 1.0) for lr in (1e-4, 5e-4)]
