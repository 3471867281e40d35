"""Presets that configs apply on top of `config_lib.base_config()`.

`apply_size` (`:size=test|tiny|small`: the model and the budgets of every
stage), `apply_regime` (`:regime=...`: the task's difficulty and the RL
budget, `REGIMES`) and `use_trained_prm` (reuse a finished SFT policy,
label set or verifier by path). Each config file's `get_config` calls them;
the schema and its checks stay in `config_lib`.
"""

from rl_rewards import errors


def apply_size(config, size: str, regime: str = "standard"):
  """Shrinks a config for tests (`size="test"`), then applies a regime.

  `tiny` keeps the defaults, except that updates and forward passes run in
  micro-batches of `CPU_MICRO_BATCH` rows and greedy evaluations in batches
  of `CPU_EVAL_BATCH` prompts (so does `small`). The `test` size
  is for the test suite and smoke runs: a ~20 k-parameter model, 2-3 operation problems, a few steps of each
  stage. `regime` names an entry of `REGIMES` (the arithmetic task's
  difficulty presets), applied last.
  """
  if size not in ("test", "tiny", "small"):
    raise errors.ConfigError(f"size: unknown size {size!r}; use test, tiny or small.")
  config.model.size = size
  if size == "test":
    _shrink_for_tests(config)
  else:
    _cpu_batches(config)
  return apply_regime(config, regime)


# Rows per micro-batch of the updates and forward passes at the CPU sizes.
# On a CPU the tiny model's SFT step (64 rows), policy update (256 rows) and
# log-probability pass run 1.4-1.6x faster in 8-row micro-batches than over
# the whole batch, the same update up to rounding
# (`experiments/benchmarks/micro_batches.py`, docs/performance.md).
CPU_MICRO_BATCH = 8
# Prompts per greedy-evaluation batch at the CPU sizes. The SFT gate's 200
# problems fit one batch of 256 rows instead of being padded to 512 (a
# decoding step costs about the same per row at either size on a CPU), and
# the held-out set's 1,000 problems are four batches of 256 instead of two
# of 512: the same rows, one compiled shape.
CPU_EVAL_BATCH = 256


def _cpu_batches(config):
  """The `tiny` and `small` sizes' micro-batches (`CPU_MICRO_BATCH`) and
  greedy-evaluation batches (`CPU_EVAL_BATCH`)."""
  config.sft.micro_batch_size = CPU_MICRO_BATCH
  config.rl.micro_batch_size = CPU_MICRO_BATCH
  config.prm.micro_batch_size = CPU_MICRO_BATCH
  config.eval.batch_size = CPU_EVAL_BATCH


def _shrink_for_tests(config):
  """The `test` size's sections (see `apply_size`)."""
  config.task.max_ops = 3
  config.task.max_new_tokens = 48
  config.task.max_steps = 8
  config.sft.batch_size = 16
  config.sft.max_steps = 4
  config.sft.gate_every_steps = 2
  config.sft.gate_eval_size = 16
  config.sft.log_every_steps = 1
  config.sft.checkpoint_every_steps = 2
  config.rl.steps = 2
  config.rl.prompts_per_step = 8
  config.rl.group_size = 2
  config.rl.eval_every_steps = 1
  config.rl.checkpoint_every_steps = 1
  config.eval.size_per_k = 8
  config.eval.batch_size = 32
  config.eval.pass_size = 16
  config.eval.pass_n = 2
  config.labels.num_problems = 8
  config.labels.samples_per_problem = 2
  config.labels.num_rollouts = 2
  config.labels.problems_per_shard = 4
  config.labels.prefix_batch_size = 16
  config.prm.steps = 4
  config.prm.batch_size = 8
  config.prm.log_every_steps = 2
  config.prm.checkpoint_every_steps = 2
  config.prm.valid_fraction = 0.25
  config.prm_eval.num_problems = 16
  config.prm_eval.valid_problems = 16
  config.prm_eval.bon_problems = 4
  config.prm_eval.bon_samples = 16
  config.prm_eval.prompts_per_batch = 8


# Regimes of the arithmetic task: what each stresses, and the keys it sets.
# A regime sets the task's difficulty and the SFT gate (where RL starts), and
# may trade prompts for samples per prompt at the same samples per step; it
# never touches a method's own keys, so every method config accepts every
# regime (`--config=configs/grpo.py:regime=long_sparse`). Measured starting
# accuracy, all-wrong-group fraction and cost: README, "Regimes".
REGIMES = {
    # 2-6 operations, SFT to 40 % held-out accuracy: most groups are mixed,
    # so the outcome reward already says much about which samples erred.
    "standard": "today's task: 2-6 operations, RL from 40 % accuracy",
    # 4-9 operations (up to ~100 response tokens), SFT stopped at 20 %: most
    # groups are all wrong, so an outcome advantage is zero for them, while a
    # process signal still marks the first wrong step of each sample.
    "long_sparse": "4-9 operations, RL from 20 % accuracy: sparse outcome",
    # long_sparse with 4 samples per prompt and twice the prompts (the same
    # 256 samples a step): P(all n wrong) = (1 - p)^n rises from 0.17 to
    # 0.41 at p = 0.2, so outcome-only methods lose even more groups, while
    # a process reward's signal does not depend on the group's other
    # samples. The lever of the process-reward papers' sample-efficiency
    # claims: the dense signal exists where the group baseline has none.
    # An ablation of long_sparse (same SFT policies), not a separate regime
    # of the comparison: the oracle's lead came out no larger (README).
    "long_sparse_n4": "long_sparse with 4 samples per prompt, 2x prompts",
    # long_sparse with SFT stopped at 10 %: outcomes made sparser by a
    # weaker starting policy rather than by smaller groups. Within
    # long_sparse, the seeds whose GRPO runs had the most all-wrong groups
    # were those where the oracle prover's lead was largest (README,
    # "Regimes"); this regime tests that trend on purpose.
    "long_weak": "long_sparse with SFT stopped at 10 %: a weaker start",
}


def apply_regime(config, regime: str):
  """Sets the keys of `REGIMES[regime]` on `config` (see `REGIMES`)."""
  if regime not in REGIMES:
    raise errors.ConfigError(f"regime: unknown regime {regime!r}; one of "
                      f"{', '.join(REGIMES)}.")
  if regime == "standard":
    return config
  task = config.task
  task.min_ops, task.max_ops = 4, 9
  # BOS + 2 digits + 9 x 3 + "=" = 31 prompt tokens; 9 steps of 11
  # characters, the answer line and EOS = 104 response tokens.
  task.max_prompt_len = max(task.max_prompt_len, 32)
  task.max_new_tokens = max(task.max_new_tokens, 112)
  config.sft.target_accuracy = min(config.sft.target_accuracy,
                                   0.10 if regime == "long_weak" else 0.20)
  if regime == "long_weak" and config.model.size != "test":
    # Accuracy on long chains can jump from under 10 % to over 20 % within
    # 50 SFT steps; a finer gate stops SFT near its target.
    config.sft.gate_every_steps = min(config.sft.gate_every_steps, 10)
  # Longer chains are learned later: the cap of the standard regime (450
  # steps) stops SFT near 0 % accuracy.
  if config.model.size != "test":
    config.sft.max_steps = max(config.sft.max_steps, 1500)
  if regime == "long_sparse_n4":
    rl = config.rl
    if rl.group_size % 2:
      raise errors.ConfigError(f"regime: {regime} halves rl.group_size, which is "
                        f"odd ({rl.group_size}).")
    rl.group_size //= 2
    rl.prompts_per_step *= 2
  return config


def use_trained_prm(config, *, sft: str = "", labels: str = "",
                    prm: str = "", model: str = "head", target: str = "soft"):
  """Sets the stages of an RL run whose step scores come from a trained PRM.

  Every stage can be taken from a finished run instead of recomputed: `sft`,
  `labels` and `prm` are workdirs whose SFT policy, label set or trained
  verifier to reuse. Without `prm` the run trains its own verifier
  (`model`, `target`: see the `prm` section) on Monte-Carlo labels; a
  generative verifier is fine-tuned gently (lr 1e-4, no value term), and
  hard or progress labels stop at a solution's first negative step.

  Returns:
    The config, with `stages`, the `init_from` keys and `prm.model/target`.
  """
  config.sft.init_from = sft
  config.labels.init_from = labels
  config.prm.init_from = prm
  config.prm.model = model
  config.prm.target = target
  config.prm.drop_after_first_negative = target in ("hard", "progress")
  if model == "generative":
    config.prm.learning_rate = 1e-4
    config.prm.warmup_steps = 10
    config.prm.value_weight = 0.0
  config.rl.prm_source = "model"
  config.stages = "sft,rl" if prm else "sft,labels,prm,rl"
  return config


def use_step_scores(config, source: str, *, sft: str = "", labels: str = "",
                    prm: str = "", model: str = "head",
                    target: str = "soft"):
  """Sets where an RL run's step scores come from: `source="model"`, a
  trained verifier (`use_trained_prm` with the other arguments), or
  `"oracle"`, the task's step checker (no labels or prm stage; `sft` still
  reuses a finished SFT policy).

  Raises:
    ConfigError: another `source`.
  """
  if source == "oracle":
    config.sft.init_from = sft
    config.rl.prm_source = "oracle"
    return config
  if source != "model":
    raise errors.ConfigError(
        f"source: {source!r}; use model (a trained verifier) or oracle (the "
        "task's step checker).")
  return use_trained_prm(config, sft=sft, labels=labels, prm=prm,
                         model=model, target=target)


def use_multiturn_task(config, distractors: int = 0):
  """Switches `config.task` to the multi-turn hidden-operands task, its
  episode budget sized for the longest chain (`task.max_ops`): turn labels
  come from the task's checker (`rl.prm_source="oracle"`) until
  `use_step_scores(config, "model")` asks for a trained turn verifier (the
  labels and prm stages on episodes: a turn is a step).

  Returns:
    The config, with the task's multi-turn keys and `rl.prm_source`.
  """
  task = config.task
  task.name = "hidden_operands"
  task.num_distractors = distractors
  # Turns of an optimal episode: 2k + 2; two more for wasted turns.
  task.max_turns = 2 * task.max_ops + 4
  task.max_steps = task.max_turns  # One step slot per turn.
  # "get xi\n" + "xi=VV\n" + "VVV+VV=VVV\n" per operation, plus the first
  # fetch and the answer: 24 tokens per operation and 24 more.
  task.max_new_tokens = 24 * task.max_ops + 24
  task.max_turn_tokens = 16
  task.max_observation_tokens = 8
  task.max_prompt_len = max(task.max_prompt_len, 3 * task.max_ops + 8)
  config.rl.prm_source = "oracle"
  return config
