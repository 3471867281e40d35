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

The turn labels are the task's ground truth (`source=oracle`, the
default). `source=model` (with `method=pav` or `method=pure`) reads them
from a trained turn verifier instead, and the stages become sft -> labels
-> prm -> rl:

    python -m experiments.train \\
        --config=configs/multiturn.py:method=pav,source=model \\
        --workdir=runs/multiturn_pav_model

* labels: the SFT policy samples episodes of train problems, and the
  prefix through each turn (with the tool's answer) is continued by
  `labels.num_rollouts` episodes of the same policy, the lookup tool's
  state restored by replaying the prefix's turns (the tool is
  deterministic): Q-hat of the turn = their mean success, the final turn's
  = the episode's reward (rl_rewards/prm/labels.py, episodes).
* prm: PAV's score-head verifier on the soft Q-hat (and V-hat of the
  question); PURE's generative verifier on progress labels (a turn is
  negative when Q-hat drops below half the previous one), as in
  configs/pure.py. Turns are the steps; the tool's tokens are never scored.
* rl: the verifier's per-turn scores are the step scores.

`sft=`, `labels=`, `prm=` reuse a finished run's SFT policy, label set or
verifier. `distractors=N` stores N extra variables that the question does
not use (fetching one wastes a turn).
"""

from rl_rewards import config_lib
from rl_rewards import config_presets

METHODS = ("grpo", "pav", "oracle", "pure")
# The methods whose turn scores can come from a trained verifier, and its
# kind and labels (configs/pav.py, configs/pure.py).
VERIFIERS = {"pav": ("head", "soft"), "pure": ("generative", "progress")}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="tiny", regime="standard", sft="",
                             labels="", prm="", method="grpo", alpha=0.5,
                             distractors=0, source="oracle")
  if arg.method not in METHODS:
    raise config_lib.ConfigError(
        f"method: unknown method {arg.method!r}; use one of {METHODS}.")
  if arg.source not in ("oracle", "model"):
    raise config_lib.ConfigError(
        f"source: {arg.source!r}; use oracle (the task's turn labels) or "
        "model (a trained turn verifier).")
  if arg.source == "model" and arg.method not in VERIFIERS:
    raise config_lib.ConfigError(
        f"source: method={arg.method} reads no trained verifier; "
        f"source=model needs method {' or '.join(VERIFIERS)}.")
  if arg.source == "oracle" and (arg.labels or arg.prm):
    raise config_lib.ConfigError(
        "labels/prm: a label set or verifier is read with source=model "
        "only.")
  config = config_presets.apply_size(config_lib.base_config(), arg.size,
                                     regime=arg.regime)
  config_presets.use_multiturn_task(config, arg.distractors)
  config.sft.init_from = arg.sft
  if arg.source == "model":
    model, target = VERIFIERS[arg.method]
    config_presets.use_step_scores(config, "model", sft=arg.sft,
                                   labels=arg.labels, prm=arg.prm,
                                   model=model, target=target)
    if arg.method == "pav":
      config.prm.value_weight = 1.0  # A of the first turn needs V-hat.
    if arg.size != "test":
      # An episode's ~10 turns are each rolled out: fewer problems and
      # rollouts than the single-turn labels keep the stage minutes long.
      config.labels.num_problems = 64
      config.labels.samples_per_problem = 2
      config.labels.num_rollouts = 4
      config.labels.problems_per_shard = 16
      config.labels.prefix_batch_size = 32
      config.prm.batch_size = 32
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
