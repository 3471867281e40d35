"""The experiment config schema: every key, its default, and its validation.

Config files in `configs/` start from `base_config()` and override values; they
never add keys (the config is locked), so a typo fails loudly. `validate()` runs
at the boundary (the runner calls it before doing any work) and raises
`ConfigError` naming the offending key.

Sections map one-to-one to components: `task`, `model`, `mesh`, `sft`, `rl`,
`labels`, `prm`, `prm_eval`, `eval`, `checkpoint`, `logging`, `train` (the
non-finite guard), `debug` (fault injection). Components receive their own
section, never the whole config. A credit-assignment method's own keys are
the section `rl.<method>` (e.g. `rl.pav.alpha`), declared and checked with
the table of methods in `config_methods.py`; the data keys of text tasks
are parsed and checked in `config_data.py`.

Following a run live (`logging`): metrics also go to TensorBoard event files
(on by default) and, with `logging.wandb_project`, to a Weights & Biases run;
long host-side loops show their progress (docs/monitoring.md). The whole
`logging` section may change when a workdir is resumed.
"""


import ml_collections

from rl_rewards import config_data
from rl_rewards import config_methods
from rl_rewards import errors
from rl_rewards.data import stepwise
from rl_rewards.tasks import tokenizer as tokenizer_lib


# A config value is missing, has the wrong type, or is out of range (the
# error of every check here; defined with the other input errors).
ConfigError = errors.ConfigError


def parse_arg(arg, **defaults):
  """Parses a `key=value,flag` config argument string into a ConfigDict.

  `get_config("size=test,runlocal")` style: a bare word means True; values are
  converted to the type of the default.

  Args:
    arg: the string after the colon in `--config=path.py:arg`, or None.
    **defaults: the accepted keys and their defaults.

  Returns:
    A ConfigDict with every key of `defaults`.
  """
  result = ml_collections.ConfigDict(dict(defaults))
  if not arg:
    return result
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition("=")
    if key not in defaults:
      raise ConfigError(
          f"Unknown config argument {key!r}; expected one of "
          f"{sorted(defaults)}.")
    default = defaults[key]
    if not sep:
      result[key] = True
    elif isinstance(default, bool):
      result[key] = value.lower() in ("1", "true", "yes", "on")
    else:
      result[key] = type(default)(value)
  return result


def base_config():
  """The full config schema with defaults (the `tiny` CPU pipeline)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Stages run in this order; each is cached in the workdir once finished.
  c.stages = "sft,rl"

  c.task = ml_collections.ConfigDict(dict(
      # arith | hidden_operands (multi-turn) | gsm8k | math | reasoning_gym
      name="arith",
      min_ops=2,               # Number of +/- operations per problem.
      max_ops=6,
      fixed_width=True,        # "023+07=030" instead of "23+7=30".
      max_value=199,           # Running values stay in [0, max_value].
      delimiter="\n",          # Step delimiter (one step a line).
      max_prompt_len=24,       # Tokens, including BOS; longer prompts fail.
      max_new_tokens=72,       # Generated tokens per response.
      max_steps=16,            # Step slots S; later steps merge into the last.
      # Text datasets (gsm8k, math: data files; reasoning_gym: by name).
      # A path is a .jsonl, .json (a list of objects) or .parquet file, or
      # a directory of .parquet shards (rl_rewards/data/readers.py).
      train_path="",
      eval_path="",
      # Layout of the files: gsm8k | math | math500 | deepscaler | aime
      # (aliases aime24, aime25; any case); "": the preset named like the
      # task (gsm8k or math).
      preset="",
      # Overrides of the preset's fields, "key=path,...": keys question,
      # answer, solution (dotted paths into nested rows, e.g.
      # "question=extra_info.question,answer=reward_model.ground_truth";
      # an empty path unmaps answer or solution) and answer_from (field: the
      # answer as is | marker: after "####" | boxed: the solution's last
      # \boxed{}). A layout without a solution (aime) cannot run SFT.
      fields="",
      dataset="",              # reasoning-gym dataset name, e.g. chain_sum.
      train_size=10000,        # reasoning-gym examples per split.
      eval_size=500,
      # A format string with {question}, or "chat": the checkpoint's own
      # chat template (tokenizer_config.json / chat_template.jinja), with
      # system_prompt ("" for none) and chat_template_kwargs, a JSON object
      # of extra template variables, e.g. '{"enable_thinking": false}'.
      prompt_template="{question}",
      system_prompt="",
      chat_template_kwargs="",
      verifier_timeout_s=5.0,  # Time limit per verifier call.
      # Multi-turn tasks (hidden_operands): max_new_tokens is the episode's
      # budget (turns and observations); max_steps should be >= max_turns.
      max_turns=16,            # Policy turns per episode.
      max_turn_tokens=16,      # Tokens per policy turn.
      max_observation_tokens=8,  # Observations are cut to this many tokens.
      num_distractors=0,       # Stored variables the question does not use.
  ))

  c.model = ml_collections.ConfigDict(dict(
      size="tiny",             # Preset: test | tiny | small (if no hf_path).
      dtype="float32",         # Activation dtype: float32 | bfloat16.
      hf_path="",              # A Hugging Face Qwen2/Llama checkpoint dir.
      tokenizer_path="",       # tokenizer.json (default: hf_path's).
      # Positions per chunk of the LM head in log-prob / loss passes: no
      # pass holds more than [rows, logits_chunk, V] float32 logits (e.g.
      # 256 x 151936 x 4 B = 155 MB per row). The default makes the CPU
      # default's sequences one chunk.
      logits_chunk=512,
      # Layers under one `nn.scan` (stacked parameters and KV cache): compile
      # time no longer grows with depth. Checkpoints and HF files convert.
      scan_layers=False,
      # Rematerialisation of each block in the backward pass: none | full
      # (keep only block inputs) | dots (keep the matmul outputs).
      remat="none",
  ))

  # Mesh axis sizes; exactly one may be -1 (all remaining devices). `rules`
  # overrides entries of the logical-axis rules table (sharding/axes.py
  # DEFAULT_RULES), e.g. "vocab=none,act_batch=data+fsdp".
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1,
                                          rules=""))

  c.sft = ml_collections.ConfigDict(dict(
      batch_size=64,
      learning_rate=2e-3,
      warmup_steps=50,
      weight_decay=0.01,
      b2=0.98,
      grad_clip=1.0,
      # Hard cap on SFT steps (~7 min of compute on 2 idle CPU cores at the
      # default size, where the wall-clock cap of earlier versions stopped).
      # Every stopping rule counts steps or samples, so a run stops at the
      # same step on any machine.
      max_steps=450,
      # Opt-in wall-clock cap (compute time, evals excluded; 0: none). A
      # slower machine stops at another step, so a time-capped run is not
      # reproducible across machines.
      max_seconds=0.0,
      target_accuracy=0.40,    # Stop at the first gate eval reaching this.
      gate_every_steps=50,     # Quick greedy eval every this many steps.
      gate_eval_size=200,      # Problems in the quick gate eval.
      dataset_size=0,          # 0: fresh problems every step; else a fixed set.
      # Gradient accumulation: rows per micro-batch of a step (0: the whole
      # batch at once). Must divide batch_size; the update is the same.
      micro_batch_size=0,
      init_from="",            # Workdir whose finished SFT stage to reuse.
      # The SFT-continued baseline (stage "sft_continue"): wall-clock budget.
      continue_seconds=0.0,
      continue_eval_every_seconds=30.0,
      log_every_steps=25,
      checkpoint_every_steps=200,
  ))

  c.rl = ml_collections.ConfigDict(dict(
      steps=75,
      max_seconds=0.0,         # Opt-in wall-clock cap (0: none; see sft).
      prompts_per_step=32,
      group_size=8,            # Samples per prompt (n).
      temperature=1.0,
      top_p=1.0,
      # The weights the sampler reads: a copy made once per RL step, cast to
      # `sampler_dtype` ("" keeps float32; "bfloat16" halves what each decode
      # step reads) and, with `sampler_gather_fsdp`, replicated over the fsdp
      # axis (still split over tensor), so decoding does not all-gather every
      # weight for every token.
      sampler_dtype="",
      sampler_gather_fsdp=False,
      learning_rate=5e-5,
      warmup_steps=0,
      weight_decay=0.0,
      b2=0.99,
      grad_clip=1.0,
      # Credit assignment: outcome | reinforce_pp | ppo | pav | pure |
      # grpo_process | clip_delta | prime | tp_grpo (config_methods.METHODS;
      # one module each in rl_rewards/runners/methods/). A method's own keys
      # are its section config.rl.<method>, e.g. config.rl.pav.alpha.
      method="outcome",
      advantage_estimator="grpo",   # Outcome baseline: grpo | drgrpo | rloo
      advantage_eps=1e-6,
      prm_source="model",      # Step scores from: model (trained PRM) | oracle
      # > 0: refresh a Q^pi verifier (score head or generative, soft labels)
      # on each rollout, with every step's target the response's outcome (a
      # one-sample Monte-Carlo Q^pi of the current policy), at this learning
      # rate (runners/verifier_refresh.py). 0: the verifier stays as trained.
      verifier_refresh_lr=0.0,
      # Log how the verifier's scores and the process part of the advantage
      # agree with the step checker (prm/*, train/process_*).
      log_oracle_agreement=True,
      # pi_old of the PPO ratio: auto (recompute with the update's forward
      # pass where the sampler's log-probs can differ: non-float32
      # activations or sampler copy, temperature != 1, top_p < 1) |
      # recompute | sampler.
      old_logprobs="auto",
      filter_accuracy=False,   # Train only on groups with mean reward in range.
      filter_accuracy_low=0.2,
      filter_accuracy_high=0.8,
      # grpo_process / clip_delta: weight of the process term.
      process_coef=1.0,
      # Discount of the token returns (ppo's GAE, reinforce_pp).
      gae_gamma=1.0,
      clip_low=0.2,            # PPO clip ratio epsilon (lower side).
      clip_high=0.2,           # Upper side (DAPO clip-higher: 0.28).
      clip_c=3.0,              # Dual-clip constant (> 1); 0 disables.
      loss_agg_mode="token-mean",
      kl_coef=0.0,             # KL-to-reference penalty in the loss.
      kl_estimator="k3",       # k1 | k2 | k3 | abs
      epochs=1,                # Passes over each rollout batch.
      minibatches=1,           # Minibatches per pass.
      # Gradient accumulation inside each optimizer step (policy, value and
      # implicit-PRM updates): rows per micro-batch, 0 = the whole
      # minibatch. Must divide the minibatch (prompts_per_step * group_size
      # / minibatches); for prime also a multiple of group_size.
      micro_batch_size=0,
      # Rows per micro-batch of the forward passes over a rollout (reference
      # and implicit-PRM log-probs, PPO values): 0 = micro_batch_size. Must
      # divide prompts_per_step * group_size.
      pass_micro_batch_size=0,
      eval_every_steps=25,
      log_every_steps=1,
      checkpoint_every_steps=25,
  ))
  for name, section in config_methods.sections().items():
    c.rl[name] = section

  # Monte-Carlo step labels from prover rollouts (stage "labels").
  c.labels = ml_collections.ConfigDict(dict(
      init_from="",            # Workdir whose finished labels to reuse.
      num_problems=256,        # Train problems to sample solutions for.
      samples_per_problem=4,   # Sampled solutions per problem (n_cov).
      num_rollouts=8,          # Prover continuations per step prefix (m).
      method="mc",             # mc (every step) | binary_search (OmegaPRM).
      # Prover: policy | best_of_k (labels Q^pi, Q^BoK = 1 - (1 - Q^pi)^K
      # derived where used) | checkpoint (another run's policy).
      prover="policy",
      prover_k=4,              # K of the Best-of-K prover.
      prover_from="",          # prover=checkpoint: that run's workdir.
      prover_stage="sft",      # ... and its stage to take the policy of.
      temperature=1.0,         # Sampling temperature of solutions/rollouts.
      problems_per_shard=64,   # Problems per label shard (resume unit).
      prefix_batch_size=64,    # Prefixes per sampler call (x m rows).
  ))

  # PRM / PAV / implicit-PRM training (stage "prm").
  c.prm = ml_collections.ConfigDict(dict(
      init_from="",            # Workdir whose trained PRM to reuse.
      # Training data: labels (the label set of the labels stage, or of
      # labels.init_from) | file (step-labelled solutions in train_path,
      # held out: valid_path, else a valid_fraction of train_path;
      # rl_rewards/data/stepwise.py). A file PRM starts from the checkpoint.
      data="labels",
      train_path="",           # .jsonl, .json, .parquet or a shard dir.
      valid_path="",
      # Layout of the files: trl (prompt, completions, labels) |
      # math_shepherd (input with "ки" step tags, label with +/-); "": trl.
      preset="",
      # Renames, "key=path,...": prompt, completions, labels, soft_labels,
      # outcome (trl) or input, label (math_shepherd); dotted paths.
      fields="",
      # head (score head read at each step's last token: a PRM or PAV) |
      # generative (step score = probability the LM head gives the step's
      # tokens; score head for V) | implicit (beta * log-ratio to the
      # policy, trained on outcome labels only).
      model="head",
      # Labels the verifier is trained on: soft (MC Q-hat, a PAV's Q^pi) |
      # hard (1[some rollout correct], Math-Shepherd) | progress
      # (1[Q-hat_k >= progress_ratio * Q-hat_{k-1}]) | prover (Q-hat^mu).
      target="soft",
      progress_ratio=0.5,      # rho of target=progress.
      steps=100,               # Optimizer steps.
      batch_size=64,           # Solutions per step (all their steps count).
      learning_rate=3e-4,
      warmup_steps=20,
      weight_decay=0.0,
      grad_clip=1.0,
      value_weight=1.0,        # Weight of V(question) at the prompt's end.
      balance_classes=False,   # Equal weight to steps with y < .5, y >= .5.
      drop_after_first_negative=False,  # No labels after a hard-0 step.
      implicit_loss="ce",      # Implicit PRM loss: ce | dpo.
      implicit_beta=0.05,      # Implicit PRM beta.
      # Gradient accumulation: rows per micro-batch of a PRM step (0: the
      # whole batch). Must divide batch_size; for model=implicit also a
      # multiple of labels.samples_per_problem (micro-batches hold groups).
      micro_batch_size=0,
      # Rows per micro-batch when a trained verifier scores solutions (RL
      # rollouts, evaluation): 0 = micro_batch_size. Batches that are not a
      # multiple are padded.
      pass_micro_batch_size=0,
      valid_fraction=0.1,      # Problems held out for validation metrics.
      # Label budget: train on the first N problems of the label set (0: all
      # of them), so one label run serves a sweep over budgets.
      label_problems=0,
      log_every_steps=25,
      checkpoint_every_steps=100,
  ))

  # PRM evaluation: ProcessBench-style F1, AUROC, Best-of-N (stage "prm_eval").
  c.prm_eval = ml_collections.ConfigDict(dict(
      num_problems=200,        # Test solutions for first-error F1 / AUROC.
      valid_problems=200,      # Other problems: threshold selection only.
      bon_problems=64,         # Held-out problems for Best-of-N.
      bon_samples=64,          # M samples each; N = 1, 4, 16, ... <= M.
      temperature=1.0,         # Sampling temperature of evaluated solutions.
      prompts_per_batch=32,    # Prompts per sampler call.
  ))

  c.eval = ml_collections.ConfigDict(dict(
      size_per_k=200,          # Held-out problems per number of ops.
      batch_size=512,
      pass_n=8,                # pass@n with temperature sampling.
      pass_size=200,           # Problems used for pass@n.
      # More held-out sets of a text task, each scored with math-verify at
      # every full evaluation (the end of sft and rl):
      # "NAME:PATH,NAME:PRESET:PATH,...". NAME ([A-Za-z0-9_]+) names the
      # metrics eval/NAME/pass@1 (the mean over sets_samples samples of
      # each problem) and eval/NAME/pass@K with K = pass_n (unbiased
      # estimator 1 - C(n - c, K) / C(n, K) from n samples, c correct).
      # PATH as task.train_path (no commas). The layout is PRESET if given,
      # else NAME when it names a preset (math500, aime24, ...), else the
      # task's (task.preset and task.fields). E.g.
      # "math500:/data/math500.jsonl,aime24:/data/aime_2024.parquet".
      sets="",
      sets_samples=0,          # Samples per problem n (0: pass_n); >= pass_n.
      sets_size=0,             # Problems of each set (0: all of them).
      sets_temperature=1.0,    # Sampling temperature of the sets.
  ))

  c.checkpoint = ml_collections.ConfigDict(dict(
      max_to_keep=2,
      # Write checkpoints in a background thread (orbax async); a stage is
      # marked done only once its last checkpoint is complete.
      async_save=False,
  ))

  # Updates with a non-finite loss or gradient are skipped and counted
  # (`*/skipped_updates` in metrics.jsonl and summary.json); this many in a
  # row stop the run with an error naming the stage and step (0: never).
  c.train = ml_collections.ConfigDict(dict(max_consecutive_skips=10))

  c.debug = ml_collections.ConfigDict(dict(
      # Injects a non-finite loss or gradient into chosen updates, to test
      # the guard: comma-separated TYPE:STEPS[:MODE], TYPE one of
      # NONFINITE_TYPES, STEPS the update number N (the model's step counter
      # after it, 1-based) or a range A-B, MODE one of NONFINITE_MODES
      # (default grad_nan); e.g. "sft:3,policy:2-4:loss_inf".
      nonfinite_steps="",
  ))

  # Where metrics go besides metrics.jsonl, and how progress is shown (see
  # the module docstring, "Following a run live").
  c.logging = ml_collections.ConfigDict(dict(
      tensorboard=True,        # Event files under <workdir>/tensorboard/.
      wandb_project="",        # A W&B project: log the run there ("": off).
      wandb_entity="",         # W&B user or team ("": your default entity).
      wandb_mode="online",     # online | offline (no network; wandb sync).
      # Progress of long host-side loops: auto (a bar on a terminal, plain
      # lines otherwise) | bar | lines | off.
      progress="auto",
      progress_every_s=30.0,   # Seconds between plain progress lines.
  ))
  return c


# Update types `debug.nonfinite_steps` can hit: the SFT step (also of
# sft_continue), the prm stage's verifier update (head, generative or
# implicit), and the RL stage's policy, PPO value and PRIME implicit-PRM
# updates.
NONFINITE_TYPES = ("sft", "prm", "policy", "value", "implicit_prm")
NONFINITE_MODES = ("grad_nan", "grad_inf", "loss_nan", "loss_inf")


def nonfinite_steps(spec: str) -> dict:
  """Parses `debug.nonfinite_steps`: {type: [(first, last, mode), ...]}.

  Raises:
    ConfigError naming the key and the bad entry.
  """
  out = {}
  for entry in (e.strip() for e in spec.split(",")):
    if not entry:
      continue
    parts = entry.split(":")
    bad = ConfigError(
        f"config.debug.nonfinite_steps: bad entry {entry!r}; expected "
        f"TYPE:STEPS[:MODE] with TYPE in {NONFINITE_TYPES}, STEPS N or A-B "
        f"(N >= 1) and MODE in {NONFINITE_MODES}.")
    if len(parts) not in (2, 3) or parts[0] not in NONFINITE_TYPES:
      raise bad
    mode = parts[2] if len(parts) == 3 else "grad_nan"
    first, _, last = parts[1].partition("-")
    try:
      first, last = int(first), int(last or first)
    except ValueError:
      raise bad from None
    if mode not in NONFINITE_MODES or not 1 <= first <= last:
      raise bad
    out.setdefault(parts[0], []).append((first, last, mode))
  return out


_KNOWN_STAGES = ("sft", "labels", "prm", "prm_eval", "rl", "sft_continue")
_ESTIMATORS = ("grpo", "drgrpo", "rloo")
_LOSS_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
             "seq-mean-token-sum-norm")
_KL = ("k1", "k2", "k3", "abs")


def _require(condition, key, message):
  if not condition:
    raise ConfigError(f"config.{key}: {message}")


def moved_key(dotted: str) -> str:
  """The key that replaced a former key (`rl.pav_alpha` -> `rl.pav.alpha`),
  or "" when `dotted` is not a former key."""
  return config_methods.renamed_keys().get(dotted, "")


def _check_keys(config, reference, prefix=""):
  for key in config.keys():
    path = f"{prefix}{key}"
    if key not in reference:
      new = moved_key(path)
      raise ConfigError(f"config.{path}: unknown key" + (
          f"; it moved to config.{new}." if new else "."))
    value, ref = config[key], reference[key]
    if isinstance(ref, ml_collections.ConfigDict):
      _require(isinstance(value, ml_collections.ConfigDict), path,
               "must be a section.")
      _check_keys(value, ref, path + ".")
    elif isinstance(ref, bool):
      _require(isinstance(value, bool), path,
               f"must be a bool, got {value!r}.")
    elif isinstance(ref, float):
      _require(isinstance(value, (int, float)) and not isinstance(value, bool),
               path, f"must be a number, got {value!r}.")
    elif isinstance(ref, int):
      _require(isinstance(value, int) and not isinstance(value, bool), path,
               f"must be an int, got {value!r}.")
    elif isinstance(ref, str):
      _require(isinstance(value, str), path,
               f"must be a string, got {value!r}.")


def stage_names(config):
  """The ordered list of stages a config runs."""
  return [s.strip() for s in config.stages.split(",") if s.strip()]


def _check_micro_batch(value, batch, key, batch_name):
  """A micro-batch size: 0 (off) or a positive divisor of `batch`."""
  _require(value >= 0, key, f"must be >= 0 (0: no micro-batches), got "
           f"{value}.")
  _require(value == 0 or batch % value == 0, key,
           f"must divide {batch_name} ({batch}), got {value}; 0 runs the "
           "whole batch at once.")


def pass_micro_batch_size(section) -> int:
  """Rows per micro-batch of a section's forward passes (`rl`, `prm`)."""
  return section.pass_micro_batch_size or section.micro_batch_size


def _validate_prm(config):
  """Checks the `labels`, `prm` and `prm_eval` sections."""
  labels, prm, prm_eval = config.labels, config.prm, config.prm_eval
  for key in ("num_problems", "samples_per_problem", "num_rollouts",
              "problems_per_shard", "prefix_batch_size", "prover_k"):
    _require(labels[key] >= 1, f"labels.{key}",
             f"must be >= 1, got {labels[key]}.")
  _require(labels.method in ("mc", "binary_search"), "labels.method",
           "must be mc or binary_search.")
  _require(labels.prover in ("policy", "best_of_k", "checkpoint"),
           "labels.prover", "must be policy, best_of_k or checkpoint.")
  _require(labels.prover != "checkpoint" or labels.prover_from,
           "labels.prover_from", "prover=checkpoint needs the workdir of "
           "the prover's run.")
  _require(labels.prover_stage in ("sft", "rl"), "labels.prover_stage",
           "must be sft or rl.")
  _require(labels.temperature > 0, "labels.temperature",
           "must be > 0 (Monte-Carlo labels need sampled rollouts).")
  _require(prm.model in ("head", "generative", "implicit"), "prm.model",
           "must be head, generative or implicit.")
  _require(prm.target in ("soft", "hard", "progress", "prover"),
           "prm.target", "must be soft, hard, progress or prover.")
  _require(0 < prm.progress_ratio <= 1, "prm.progress_ratio",
           "must be in (0, 1].")
  _require(prm.implicit_loss in ("ce", "dpo"), "prm.implicit_loss",
           "must be ce or dpo.")
  for key in ("steps", "batch_size", "log_every_steps",
              "checkpoint_every_steps"):
    _require(prm[key] >= 1, f"prm.{key}", f"must be >= 1, got {prm[key]}.")
  _require(prm.learning_rate > 0, "prm.learning_rate", "must be > 0.")
  _require(prm.implicit_beta > 0, "prm.implicit_beta", "must be > 0.")
  _require(prm.value_weight >= 0, "prm.value_weight", "must be >= 0.")
  _require(0 <= prm.valid_fraction < 1, "prm.valid_fraction",
           "must be in [0, 1).")
  _require(prm.label_problems >= 0, "prm.label_problems",
           f"must be >= 0 (0: every problem), got {prm.label_problems}.")
  from_file = _validate_prm_data(config)
  # File rows are single solutions: groups of one.
  group = 1 if from_file else labels.samples_per_problem
  _require(prm.batch_size % group == 0, "prm.batch_size",
           f"must be a multiple of labels.samples_per_problem "
           f"({labels.samples_per_problem}): batches hold whole groups.")
  dpo = prm.model == "implicit" and prm.implicit_loss == "dpo"
  _require(not dpo or not from_file, "prm.implicit_loss",
           "the DPO loss pairs solutions of a problem, and prm.data='file' "
           "rows are single solutions: use ce.")
  _require(not dpo or group >= 2, "labels.samples_per_problem",
           "the DPO loss pairs solutions of a problem: need >= 2.")
  for key in ("num_problems", "valid_problems", "bon_problems", "bon_samples",
              "prompts_per_batch"):
    _require(prm_eval[key] >= 1, f"prm_eval.{key}",
             f"must be >= 1, got {prm_eval[key]}.")
  _require(prm_eval.temperature > 0, "prm_eval.temperature", "must be > 0.")
  _check_micro_batch(prm.micro_batch_size, prm.batch_size,
                     "prm.micro_batch_size", "prm.batch_size")
  _require(prm.model != "implicit" or prm.micro_batch_size % group == 0,
           "prm.micro_batch_size",
           f"must be a multiple of labels.samples_per_problem "
           f"({labels.samples_per_problem}) for model=implicit: micro-batches "
           "hold whole groups.")
  _require(prm.pass_micro_batch_size >= 0, "prm.pass_micro_batch_size",
           f"must be >= 0, got {prm.pass_micro_batch_size}.")


PRM_DATA = ("labels", "file")


def _validate_prm_data(config) -> bool:
  """Checks `prm.data` and its file keys; returns whether it is "file"."""
  prm = config.prm
  _require(prm.data in PRM_DATA, "prm.data",
           f"must be one of {PRM_DATA}, got {prm.data!r}.")
  if prm.data != "file":
    for key in ("train_path", "valid_path", "preset", "fields"):
      _require(not prm[key], f"prm.{key}", "is only read with "
               "prm.data='file'.")
    return False
  stages = stage_names(config)
  _require("labels" not in stages, "stages", "prm.data='file' trains on "
           "prm.train_path: drop the labels stage.")
  _require(bool(prm.train_path) or bool(prm.init_from) or "prm" not in stages,
           "prm.train_path", "prm.data='file' needs a file of step-labelled "
           "solutions (.jsonl, .json, .parquet or a directory of .parquet "
           "shards).")
  _require(prm.target in ("soft", "hard"), "prm.target",
           f"must be soft or hard with prm.data='file' (the file's labels, "
           f"or them thresholded at 1/2), got {prm.target!r}.")
  preset = prm.preset.strip().lower() or "trl"
  _require(preset in stepwise.PRESETS, "prm.preset",
           f"unknown preset {prm.preset!r}; one of "
           f"{sorted(stepwise.PRESETS)}.")
  try:
    stepwise.field_map(preset, prm.fields)
  except ValueError as e:
    raise ConfigError(f"config.prm.fields: {e}") from None
  return True


_WANDB_MODES = ("online", "offline")
_PROGRESS = ("auto", "bar", "lines", "off")


def _validate_logging(logging):
  _require(logging.wandb_mode in _WANDB_MODES, "logging.wandb_mode",
           f"must be one of {_WANDB_MODES}, got {logging.wandb_mode!r}.")
  _require(not logging.wandb_entity or logging.wandb_project,
           "logging.wandb_entity", "is set but logging.wandb_project is "
           "not; set the project to log to W&B.")
  for key in ("wandb_project", "wandb_entity"):
    _require(not any(c in logging[key] for c in "/\\#?%:"),
             f"logging.{key}", f"must not contain / \\ # ? % or :, got "
             f"{logging[key]!r}.")
  _require(logging.progress in _PROGRESS, "logging.progress",
           f"must be one of {_PROGRESS}, got {logging.progress!r}.")
  _require(logging.progress_every_s > 0, "logging.progress_every_s",
           f"must be > 0, got {logging.progress_every_s}.")


def validate(config):
  """Checks keys, types and ranges; raises ConfigError naming the key."""
  _check_keys(config, base_config())
  for stage in stage_names(config):
    _require(stage in _KNOWN_STAGES, "stages",
             f"unknown stage {stage!r}; known: {', '.join(_KNOWN_STAGES)}.")
  task = config.task
  _require(task.name in ("arith", "hidden_operands", "gsm8k", "math",
                         "reasoning_gym"),
           "task.name", f"unknown task {task.name!r}.")
  _require(task.name != "hidden_operands" or
           set(stage_names(config)) <= {"sft", "labels", "prm", "rl",
                                        "sft_continue"},
           "stages", "the multi-turn task runs sft, labels, prm and rl "
           "(prm_eval scores single-turn solutions).")
  for key in ("max_turns", "max_turn_tokens"):
    _require(task[key] >= 1, f"task.{key}", f"must be >= 1, got {task[key]}.")
  for key in ("max_observation_tokens", "num_distractors"):
    _require(task[key] >= 0, f"task.{key}", f"must be >= 0, got {task[key]}.")
  _require(1 <= task.min_ops <= task.max_ops, "task.min_ops",
           "need 1 <= min_ops <= max_ops.")
  _require(task.name != "reasoning_gym" or task.dataset, "task.dataset",
           "name the reasoning-gym dataset (e.g. chain_sum).")
  _require(task.prompt_template == "chat" or "{question}" in
           task.prompt_template, "task.prompt_template",
           'must contain {question}, or be "chat" (the checkpoint\'s chat '
           "template).")
  for key in ("system_prompt", "chat_template_kwargs"):
    _require(task.prompt_template == "chat" or not task[key], f"task.{key}",
             'needs prompt_template="chat".')
  _require(task.prompt_template != "chat" or
           task.name not in ("arith", "hidden_operands"),
           "task.prompt_template",
           '"chat" needs a checkpoint tokenizer (not the arith task).')
  try:
    tokenizer_lib.parse_template_kwargs(
        task.chat_template_kwargs, key="config.task.chat_template_kwargs")
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _require(config.model.dtype in ("float32", "bfloat16"), "model.dtype",
           "must be float32 or bfloat16.")
  _require(task.max_prompt_len > 0, "task.max_prompt_len", "must be > 0.")
  _require(task.max_new_tokens > 0, "task.max_new_tokens", "must be > 0.")
  _require(len(task.delimiter) > 0, "task.delimiter", "must be non-empty.")
  sizes = [config.mesh.data, config.mesh.fsdp, config.mesh.tensor]
  _require(sum(s == -1 for s in sizes) <= 1, "mesh",
           "at most one axis size may be -1.")
  _require(all(s == -1 or s >= 1 for s in sizes), "mesh",
           "axis sizes must be >= 1 or -1.")

  sft = config.sft
  for key in ("batch_size", "max_steps", "gate_every_steps", "gate_eval_size",
              "log_every_steps", "checkpoint_every_steps"):
    _require(sft[key] > 0, f"sft.{key}", f"must be > 0, got {sft[key]}.")
  _require(sft.learning_rate > 0, "sft.learning_rate", "must be > 0.")
  _require(0.0 <= sft.target_accuracy <= 1.0, "sft.target_accuracy",
           "must be in [0, 1].")
  _require(sft.dataset_size >= 0, "sft.dataset_size", "must be >= 0.")
  for key in ("sft.max_seconds", "rl.max_seconds"):
    section, name = key.split(".")
    _require(config[section][name] >= 0, key, "must be >= 0 (0: no "
             "wall-clock cap).")
  _check_micro_batch(sft.micro_batch_size, sft.batch_size,
                     "sft.micro_batch_size", "sft.batch_size")
  _require(config.rl.sampler_dtype in ("", "float32", "bfloat16"),
           "rl.sampler_dtype",
           f"must be '', float32 or bfloat16, got {config.rl.sampler_dtype!r}.")
  _require(config.model.remat in ("none", "full", "dots"), "model.remat",
           f"must be none, full or dots, got {config.model.remat!r}.")
  _require(config.model.logits_chunk >= 1, "model.logits_chunk",
           f"must be >= 1, got {config.model.logits_chunk}.")

  rl = config.rl
  _require(rl.group_size >= 1, "rl.group_size",
           f"must be a positive number of samples per prompt, got "
           f"{rl.group_size}.")
  _require(rl.advantage_estimator != "rloo" or rl.group_size >= 2,
           "rl.group_size", "RLOO needs at least 2 samples per prompt.")
  for key in ("steps", "prompts_per_step", "epochs", "minibatches",
              "eval_every_steps", "log_every_steps", "checkpoint_every_steps"):
    _require(rl[key] > 0, f"rl.{key}", f"must be > 0, got {rl[key]}.")
  batch = rl.prompts_per_step * rl.group_size
  _require(batch % rl.minibatches == 0, "rl.minibatches",
           f"must divide the rollout batch {batch}.")
  _require(rl.temperature >= 0, "rl.temperature", "must be >= 0.")
  _require(0 < rl.top_p <= 1, "rl.top_p", "must be in (0, 1].")
  _require(rl.advantage_estimator in _ESTIMATORS, "rl.advantage_estimator",
           f"must be one of {_ESTIMATORS}.")
  _require(rl.method in config_methods.METHODS, "rl.method",
           f"must be one of {tuple(config_methods.METHODS)}.")
  _require(rl.prm_source in ("model", "oracle"), "rl.prm_source",
           "must be 'model' or 'oracle'.")
  config_methods.validate(rl)
  _require(rl.verifier_refresh_lr >= 0, "rl.verifier_refresh_lr",
           "must be >= 0 (0: no refresh).")
  _require(rl.old_logprobs in ("auto", "recompute", "sampler"),
           "rl.old_logprobs", "must be auto, recompute or sampler, got "
           f"{rl.old_logprobs!r}.")
  _require(config.task.max_steps >= 1, "task.max_steps", "must be >= 1.")
  _require(rl.loss_agg_mode in _LOSS_AGG, "rl.loss_agg_mode",
           f"must be one of {_LOSS_AGG}.")
  _require(rl.kl_estimator in _KL, "rl.kl_estimator",
           f"must be one of {_KL}.")
  _require(rl.clip_c == 0 or rl.clip_c > 1, "rl.clip_c",
           "the dual-clip constant must be > 1 (or 0 to disable).")
  _check_micro_batch(rl.micro_batch_size, batch // rl.minibatches,
                     "rl.micro_batch_size",
                     "the minibatch prompts_per_step * group_size / "
                     "minibatches")
  _check_micro_batch(rl.pass_micro_batch_size, batch,
                     "rl.pass_micro_batch_size",
                     "the rollout batch prompts_per_step * group_size")
  _validate_prm(config)
  _validate_logging(config.logging)
  _require(config.train.max_consecutive_skips >= 0,
           "train.max_consecutive_skips", "must be >= 0 (0: never stop).")
  nonfinite_steps(config.debug.nonfinite_steps)
  _require(config.eval.size_per_k > 0, "eval.size_per_k", "must be > 0.")
  _require(config.eval.pass_n >= 1, "eval.pass_n", "must be >= 1.")
  config_data.validate_text_data(config, stage_names(config))
  return config
