"""RL on multi-turn episodes: the hidden-operands task with a lookup tool.

    python -m experiments.train --config=configs/multiturn.py \\
        --workdir=runs/multiturn                       # GRPO on the outcome
    python -m experiments.train --config=configs/multiturn.py:method=oracle \\
        --workdir=runs/multiturn_oracle                # turn-level oracle
    python -m experiments.train --config=configs/multiturn.py:size=test \\
        --workdir=/tmp/mt                              # a smoke run

The question names a chain of stored variables ("x0+x1-x2="); each turn is
one line: "get xi" (the tool answers "xi=V"), a partial result
"a+b=c", or the answer "#N" (rl_rewards/tasks/hidden_operands.py). A
k-operation chain takes 2k + 2 turns. Stages: sft (optimal episodes with
the tool's answers, which are masked out of the loss) -> rl. The rollout
keeps the KV cache across turns (rl_rewards/rollout/episodes.py); the
tool's tokens are context, never trained on, and each turn is a step, so
every method assigns its credit per turn:

* `method=grpo`: the group z-score of the final answer's 0/1 reward on
  every policy token (outcome only).
* `method=pav`: PAV's effective reward, r − mean(group r) plus α·(Q_k −
  Q_{k−1}) with the oracle's Q per turn (1 until the first turn that makes
  no progress, 0 after), α = `alpha` (default 0.5).
* `method=oracle`: the same with α = 1 and a Best-of-1 prover
  (configs/oracle.py on turns): −1 exactly on the first wasted or wrong
  turn.
* `method=pure`: PURE's min-form credit on the oracle's per-turn labels
  (+1 progress / −1 not) plus the verifiable outcome reward.

The turn labels are the task's ground truth (`rl.prm_source="oracle"`):
the labels and prm stages (a trained turn verifier) are not available for
this task. `distractors=N` stores N extra variables that the question does
not use (fetching one wastes a turn).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets

METHODS = ("grpo", "pav", "oracle", "pure")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny", regime="standard", sft="",
                             method="grpo", alpha=0.5, distractors=0)
  if arg.method not in METHODS:
    raise config_lib.ConfigError(
        f"method: unknown method {arg.method!r}; use one of {METHODS}.")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config_presets.use_multiturn_task(config, arg.distractors)
  config.sft.init_from = arg.sft
  if arg.method == "grpo":
    config.rl.method = "outcome"
    config.rl.advantage_estimator = "grpo"
  elif arg.method in ("pav", "oracle"):
    config.rl.method = "pav"
    config.rl.advantage_estimator = "drgrpo"  # PAV's Eq. 5 (methods/pav.py).
    config.rl.pav.alpha = 1.0 if arg.method == "oracle" else arg.alpha
    config.rl.pav.prover_k = 1
  else:
    config.rl.method = "pure"
  return config


def get_sweep():
  return [{"rl.pav.alpha": alpha} for alpha in (0.5, 1.0, 2.0)]
