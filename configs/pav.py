"""PAV: process advantage verifier rewards (Setlur et al., 2410.08146).

    python -m experiments.train --config=configs/pav.py --workdir=runs/pav
    python -m experiments.train --config=configs/pav.py:sft=runs/s0 \\
        --workdir=runs/pav_s0                    # reuse a finished SFT policy
    python -m experiments.train --config=configs/pav.py:prm=runs/pav \\
        --workdir=runs/pav_again                 # reuse SFT policy + verifier

Stages: sft -> labels -> prm -> rl. The SFT policy samples solutions to
train problems and every step prefix gets `labels.num_rollouts` Monte-Carlo
continuations from the same (base) policy: Q-hat = fraction correct. A
score-head verifier initialised from the policy is trained on Q-hat (soft
cross-entropy), so it predicts Q^pi of each step and V^pi of the question.
RL uses the effective reward of PAV (Eq. 5): every token of step k gets
r - mean(group r) plus alpha * A^mu_k, where A^mu_k = Q^mu_k - Q^mu_{k-1}
is the progress under a Best-of-K prover, Q^mu = 1 - (1 - Q^pi)^K. Neither
term is divided by a group std, so alpha means the paper's alpha in every
group. `alpha=0` is exactly outcome-only Dr. GRPO.

`refresh=1e-4` refreshes the verifier during RL on each rollout (every
step's target: the response's outcome, a one-sample Monte-Carlo Q^pi of the
current policy; rl_rewards/runners/verifier_refresh.py) at that learning
rate, so Q^pi follows the policy instead of staying the SFT policy's.

`verifier=generative` is a generative PAV: Q^pi is read from the LM head
(the probability it gives the step's tokens, fine-tuned on the same Q-hat
targets) and V^pi from the score head at the question's end.

What to expect on 2 CPU cores (tiny model): labels about 30 s, verifier
training about 40 s, then RL at the cost of GRPO plus one verifier forward
pass per step; the summary prints accuracy after SFT and after RL, and the
verifier's validation error.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      alpha=0.5, k=4, verifier="head", refresh=0.0)
  config = config_lib.base_config()
  config_presets.use_trained_prm(config, sft=arg.sft, labels=arg.labels,
                                 prm=arg.prm, model=arg.verifier,
                                 target="soft")
  config.prm.value_weight = 1.0  # A^mu of the first step needs V^pi.
  config.rl.method = "pav"
  config.rl.advantage_estimator = "drgrpo"  # r - group mean (Eq. 5).
  config.rl.pav.alpha = arg.alpha
  config.rl.pav.prover_k = arg.k
  config.rl.verifier_refresh_lr = arg.refresh
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """Effective-reward weight alpha and Best-of-K prover strength."""
  return [{"rl.pav.alpha": alpha, "rl.pav.prover_k": k}
          for alpha in (0.25, 0.5, 1.0) for k in (1, 4)]
