"""SPA-RL: stepwise progress attribution on multi-turn episodes.

Wang et al., "SPA-RL: Reinforcing LLM Agents via Stepwise Progress
Attribution" (arXiv 2505.20732; code WangHanLinHenry/SPA-RL-Agent).

    python -m experiments.train --config=configs/spa_rl.py --workdir=runs/spa_rl
    python -m experiments.train --config=configs/spa_rl.py:grounding=0 \\
        --workdir=runs/spa_rl_g0                       # contributions only
    python -m experiments.train --config=configs/spa_rl.py:size=test \\
        --workdir=/tmp/spa_rl                          # a smoke run

The hidden-operands task (configs/multiturn.py). A progress estimator (a
copy of the SFT policy's trunk with a scalar head, read at the last token of
each policy turn) predicts a contribution ĉ_k per turn, trained online on
each rollout so that an episode's contributions sum to its outcome,
L = (Σ_k ĉ_k − R)². The exact rule, as the paper's code
(`prm/train_our_progress_model.py`, `prm/rl_data_org.py`): the turn reward
is r_k = α·ĉ_k + β·g_k with α = 1 (`alpha`) and β = 0.5 (`grounding`) for
an action the environment executed (g_k = 1; 0 when the tool answered "?",
the analogue of "Nothing happens"; always 1 on the last turn); the paper
optimises these rewards with PPO at γ = 1.

Where we differ (rl_rewards/runners/methods/spa_rl.py): the estimator is
updated once per RL step on that step's rollout (the paper trains it
offline on explored trajectories) and then scores it; the advantage of a
turn's tokens is its return-to-go Σ_{j≥k} r_j (+ `outcome`·R, 0 in the
paper) minus the group mean of the episodes' returns (Dr. GRPO's centring,
`rl.advantage_estimator="drgrpo"`; "rloo" takes the mean of the others)
instead of PPO's learned critic. The estimator has its own optimizer
(`lr`, `rl.spa_rl.learning_rate`) and is checkpointed with the policy.
Logged: `train/spa_rl/loss`, `loss_after`, `sum_abs_error`,
`grounded_fraction` and `oracle_corr` (ĉ against the task's turn labels).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny", regime="standard", sft="",
                             alpha=1.0, grounding=0.5, outcome=0.0, lr=1e-4,
                             distractors=0)
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config_presets.use_multiturn_task(config, arg.distractors)
  config.sft.init_from = arg.sft
  config.rl.method = "spa_rl"
  config.rl.advantage_estimator = "drgrpo"
  config.rl.spa_rl.contribution_coef = arg.alpha
  config.rl.spa_rl.grounding_coef = arg.grounding
  config.rl.spa_rl.outcome_coef = arg.outcome
  config.rl.spa_rl.learning_rate = arg.lr
  return config


def get_sweep():
  return [{"rl.spa_rl.grounding_coef": g, "rl.spa_rl.outcome_coef": o}
          for g in (0.0, 0.5) for o in (0.0, 1.0)]
