"""Process reward model: Monte-Carlo labels -> PRM -> first-error F1, Best-of-N.

    python -m experiments.train --config=configs/prm.py:sft=runs/s0 \\
        --workdir=runs/prm                     # reuse a finished SFT policy
    python -m experiments.eval_prm --workdir=runs/prm   # the tables again
    python -m experiments.search --workdir=runs/prm     # beam search vs BoN

Stages: sft (or a finished SFT policy with `sft=<workdir>`), labels, prm,
prm_eval. The policy samples 4 solutions for each of 512 train problems and
every step prefix gets m = 16 continuations from the policy (Q-hat =
fraction correct). The verifier is the policy itself fine-tuned as a
generative PRM (a step's score is the probability it gives the step's
tokens) on progress labels: step k is negative when Q-hat_k < Q-hat_{k-1}/2,
and the steps after a solution's first negative one are not trained on.
`model=head,target=soft` trains the classic score-head PRM on Q-hat instead
(the PAV's verifier), `target=hard` uses Math-Shepherd labels (1[any
continuation correct]).

The evaluation samples held-out solutions and reports first-error F1 with
a threshold chosen on separate validation problems, next to the oracle PRM
(the task's step checker, F1 = 1) and a random scorer, step AUROC, and
Best-of-N accuracy (N = 1, 4, 16, 64) for min / last / product / mean
aggregation and PRM-weighted voting, against majority vote and the oracle.
On 2 CPU cores with a reused tiny SFT policy: labels about 2 minutes, PRM
training under a minute, evaluation about 2 minutes.
"""

from rl_rewards import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", model="generative",
      target="progress")
  config = config_lib.base_config()
  config.stages = "sft,labels,prm,prm_eval"
  config.sft.init_from = arg.sft
  config.labels.num_problems = 512
  config.labels.num_rollouts = 16
  config.labels.problems_per_shard = 64
  config.labels.prefix_batch_size = 32
  config.prm.model = arg.model
  config.prm.target = arg.target
  config.prm.drop_after_first_negative = arg.target in ("hard", "progress")
  config.prm.steps = 100
  config.prm.learning_rate = 1e-4
  config.prm.warmup_steps = 10
  config.prm.value_weight = 0.0 if arg.model == "generative" else 1.0
  config.prm_eval.num_problems = 500
  config.prm_eval.valid_problems = 500
  config.prm_eval.bon_problems = 200
  config.prm_eval.bon_samples = 64
  # `test` shrinks sections.
  return config_lib.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """Verifier model and training labels."""
  return [{"prm.model": model, "prm.target": target}
          for model in ("generative", "head")
          for target in ("progress", "hard", "soft")]
