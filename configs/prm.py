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

Two grids for `experiments.sweep`: the default one crosses the verifier
model with its training labels; `:sweep=budget` crosses the seven verifier
kinds (score head on soft, hard and prover labels, generative on progress,
soft and prover labels, implicit) with the label budget, training each on
the first 128, 256 or 1024 problems (`prm.label_problems`; 2, 4 or 8 at
size `test`) of one finished label run. The label run names a Best-of-K
prover, so that the prover target Q̂^μ = 1 − (1 − Q̂^π)^K differs from the
soft one (the Monte-Carlo rollouts, and so every other target, are the
policy's either way). Without `labels=`, every point labels its own set,
of as many problems as the largest budget, with that prover:

    python -m experiments.train --config=configs/prm.py:sft=runs/s0 \
        --config.stages=sft,labels --config.labels.num_problems=1024 \
        --config.labels.num_rollouts=8 --config.labels.prover=best_of_k \
        --workdir=runs/budget/labels
    python -m experiments.sweep \
        --config=configs/prm.py:sft=runs/s0,labels=runs/budget/labels,sweep=budget \
        --workdir=runs/budget

`data=file` trains the verifier on step-labelled solutions a researcher
already has instead of Monte-Carlo labels, from a Hugging Face checkpoint
with its chat template (stage `prm` only: the PRM starts from the
checkpoint):

    python -m experiments.train --config=configs/prm.py:data=file,model=head \
        --config.model.hf_path=/path/to/Qwen2.5-Math-1.5B-Instruct \
        --config.prm.train_path=/path/to/prm_train.jsonl \
        --config.prm.valid_path=/path/to/prm_test.jsonl \
        --config.task.train_path=/path/to/gsm8k/train.jsonl \
        --config.task.eval_path=/path/to/gsm8k/test.jsonl \
        --workdir=runs/prm_file

The files (.jsonl, .json, .parquet or a directory of .parquet shards) are
in TRL's stepwise layout (`prompt`, `completions`, `labels`, soft labels
allowed) or, with `--config.prm.preset=math_shepherd`, Math-Shepherd's
(`input` with "ки" step tags, `label` with +/-); `prm.fields` renames
fields (rl_rewards/data/stepwise.py). The task is the one RL will run: its
chat template renders the prompts, its delimiter (a blank line, as in
configs/qwen_gsm8k.py) joins the steps, and an RL run on it takes this
verifier with `--config.prm.init_from=runs/prm_file
--config.rl.prm_source=model` and a process-reward method.
`target=hard` trains on the labels thresholded at 1/2 instead of as given.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = _parse(arg)
  config = config_lib.base_config()
  config.stages = ("sft,prm,prm_eval" if arg.labels else
                   "sft,labels,prm,prm_eval")
  config.sft.init_from = arg.sft
  config.labels.init_from = arg.labels
  config.labels.num_problems = 512
  config.labels.num_rollouts = 16
  config.labels.problems_per_shard = 64
  config.labels.prefix_batch_size = 32
  config.prm.update(verifier_settings(arg.model, arg.target or "progress"))
  config.prm.steps = 100
  config.prm.learning_rate = 1e-4
  config.prm.warmup_steps = 10
  config.prm_eval.num_problems = 500
  config.prm_eval.valid_problems = 500
  config.prm_eval.bon_problems = 200
  config.prm_eval.bon_samples = 64
  # `test` shrinks sections.
  config = config_presets.apply_size(config, arg.size, regime=arg.regime)
  if arg.data == "file":
    _from_file(config, arg)
  elif arg.data != "labels":
    raise config_lib.ConfigError(
        f"configs/prm.py: data={arg.data!r} must be labels or file.")
  if arg.sweep == "budget":
    # The label set holds the largest budget (ignored with `labels=`).
    config.labels.num_problems = max(budget_problems(arg.size))
    config.labels.prover = "best_of_k"
  return config


def _parse(arg):
  return config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="",
      model="generative", target="", sweep="kinds", data="labels")


def _from_file(config, arg):
  """`data=file`: a PRM trained on `prm.train_path` from `model.hf_path`."""
  config.stages = "prm"
  config.sft.init_from = ""
  config.labels.init_from = ""
  config.prm.data = "file"
  config.prm.update(verifier_settings(arg.model, arg.target or "soft"))
  # The files hold no labels after a mistake to drop, and no V-hat.
  config.prm.drop_after_first_negative = False
  config.prm.value_weight = 0.0
  config.task.name = "gsm8k"
  config.task.prompt_template = "chat"
  # Steps joined by a blank line, as the RL config (configs/qwen_gsm8k.py)
  # and ProcessBench cut them; a step may hold single newlines.
  config.task.delimiter = "\n\n"
  if arg.size == "test":
    config.task.max_prompt_len = 64
    config.task.max_new_tokens = 48
    config.prm.steps = 2
    config.prm.warmup_steps = 0
    config.prm.log_every_steps = 1
    config.prm.checkpoint_every_steps = 2
    return
  config.model.dtype = "bfloat16"
  config.model.scan_layers = True
  config.model.remat = "full"
  config.model.logits_chunk = 128
  config.mesh.data = 1
  config.mesh.fsdp = -1               # Shard parameters over local devices.
  config.task.max_prompt_len = 320
  config.task.max_new_tokens = 768
  config.task.max_steps = 32
  config.prm.steps = 1000
  config.prm.batch_size = 32
  config.prm.micro_batch_size = 8
  config.prm.pass_micro_batch_size = 32
  config.prm.learning_rate = 1e-5
  config.prm.warmup_steps = 50
  config.prm.log_every_steps = 10
  config.prm.checkpoint_every_steps = 200


def verifier_settings(model: str, target: str) -> dict:
  """The `prm` keys that follow from a verifier's model and labels."""
  return {"model": model, "target": target,
          # Hard and progress labels stop at a solution's first negative step.
          "drop_after_first_negative": target in ("hard", "progress"),
          # A generative verifier's step scores come from its LM head.
          "value_weight": 0.0 if model == "generative" else 1.0}


# (model, target) of each verifier kind the budget grid compares.
BUDGET_KINDS = (("head", "soft"), ("head", "hard"), ("generative", "progress"),
                ("generative", "soft"), ("implicit", "soft"),
                ("head", "prover"), ("generative", "prover"))
# Label budgets (`prm.label_problems`) of the budget grid, by size: `test`
# labels 8 problems.
BUDGET_PROBLEMS = {"test": (2, 4, 8), "tiny": (128, 256, 1024),
                   "small": (128, 256, 1024)}


def budget_problems(size: str) -> tuple[int, ...]:
  if size not in BUDGET_PROBLEMS:
    raise config_lib.ConfigError(
        f"configs/prm.py: size={size!r} must be one of "
        f"{', '.join(BUDGET_PROBLEMS)}.")
  return BUDGET_PROBLEMS[size]


def get_sweep(arg=None):
  """`sweep=kinds`: verifier model x labels; `sweep=budget`: kind x budget."""
  arg = _parse(arg)
  if arg.sweep == "budget":
    kinds, budgets = BUDGET_KINDS, budget_problems(arg.size)
  elif arg.sweep == "kinds":
    kinds = [(model, target) for model in ("generative", "head")
             for target in ("progress", "hard", "soft")]
    budgets = (0,)
  else:
    raise config_lib.ConfigError(
        f"configs/prm.py: sweep={arg.sweep!r} must be kinds or budget.")
  points = []
  for model, target in kinds:
    for problems in budgets:
      point = {f"prm.{k}": v
               for k, v in verifier_settings(model, target).items()}
      if problems:
        point["prm.label_problems"] = problems
      points.append(point)
  return points
