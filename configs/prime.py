"""PRIME: online implicit PRM from outcome labels (Cui et al., 2502.01456).

    python -m experiments.train --config=configs/prime.py --workdir=runs/prime

The implicit PRM starts as a copy of the SFT policy; its token rewards are
β·(log π_φ − log π_ref) with π_ref the SFT policy (exactly 0 at the start).
Every step it is updated with cross-entropy on the outcome labels of the
rollout (its own optimizer state is checkpointed), then advantages are RLOO
per source (implicit process rewards and outcome), γ = 1 returns, whitened.
Prompts whose group accuracy is outside [0.2, 0.8] are filtered out before
the implicit-PRM update and the advantages (their loss weight is 0), as in
PRIME. `rloo=paper` uses Eq. 5's leave-one-out form instead of the code's;
`batch_norm=1` rescales the process rewards as the reference's option does.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", rloo="code",
      batch_norm=False)
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config.sft.init_from = arg.sft
  config.rl.method = "prime"
  config.rl.prime.beta = 0.05
  config.rl.prime.learning_rate = 1e-4
  config.rl.filter_accuracy = True
  config.rl.prime.rloo_form = arg.rloo
  config.rl.prime.batch_norm = bool(arg.batch_norm)
  return config


def get_sweep():
  return [{"rl.prime.beta": beta, "rl.prime.process_coef": coef}
          for beta in (0.05, 0.5) for coef in (1.0, 5.0)]
