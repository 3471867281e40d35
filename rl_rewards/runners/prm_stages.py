"""The PRM stages labels -> prm, and the scorer the RL stage uses.

    label_path, summary = run_labels(ctx, policy_params)  # stage "labels"
    prm, summary = run_prm_train(ctx, policy_params, label_path)  # "prm"
    scorer = load_scorer(ctx, prm)    # .score_rollout(...) for the RL stage

* labels: the policy samples `samples_per_problem` solutions for each of
  `num_problems` train problems (indices from `LABEL_INDEX_OFFSET`, a stream
  separate from SFT and RL), and every step prefix is labelled with the
  prover's Monte-Carlo rollouts (`prm.labels`). Shards of
  `problems_per_shard` problems are written to `<workdir>/labels/` as they
  finish; a killed run resumes after the last complete shard, and every
  shard's randomness depends only on (seed, shard).
  On a multi-turn task (`task.multi_turn`) the solutions are episodes and
  a turn is a step (`label_episode_shard`): the prefix through turn k,
  with its observation, is continued by prover episodes whose environment
  is restored by replaying the prefix's turns (a deterministic
  environment), and the records carry `turn_ids` (observations −1).
* prm: a score-head PRM/PAV (backbone initialised from the policy) trained
  with cross-entropy on the labels, or an implicit PRM (a copy of the
  policy trained on outcome labels); batches are a pure function of the
  step, so training resumes exactly from its checkpoint. With
  `prm.data="file"` the labels come from step-labelled solutions in
  `prm.train_path` / `prm.valid_path` instead (`rl_rewards/data/stepwise.py`),
  turned into the same label records (`prm_files.records_from_examples`): each row
  is tokenized as the sampler lays out a rollout, with the prompt rendered
  by the task's template and the steps joined by its delimiter, so the
  trained PRM reads its step scores where RL and search will. The summary
  records the delimiter, and a run that loads the PRM with another one is
  refused (`load_finished_prm`).
* prm_eval: see `runners/prm_eval.py`.

Each stage is reused once finished (`Checkpointer.done_info()`), or taken
from another workdir with `labels.init_from` / `prm.init_from`.
"""

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from rl_rewards import checkpoints
from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards import errors
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.data import order
from rl_rewards.data import stepwise
from rl_rewards.prm import evaluation as prm_eval_lib
from rl_rewards.prm import label_store
from rl_rewards.prm import labels as labels_lib
from rl_rewards.prm import scoring
from rl_rewards.prm import training
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import prm_files
from rl_rewards.runners import programs
from rl_rewards.runners import resume
from rl_rewards.runners.methods import base as method_base
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import nonfinite

LABELS_STAGE = "labels"
PRM_STAGE = "prm"
EVAL_STAGE = "prm_eval"
# Problem indices of the labelling stream (SFT uses 0.., RL 10_000_000..).
LABEL_INDEX_OFFSET = 20_000_000
AGGREGATIONS = ("min", "last", "product", "mean")


def run_config(workdir: str):
  """The resolved config a run was started with (its `config.json`)."""
  path = os.path.join(workdir, metrics_lib.CONFIG_FILE)
  if not os.path.exists(path):
    raise config_lib.ConfigError(f"{workdir} holds no run ({path} is "
                                 "missing).")
  config = config_lib.base_config()
  _update(config, config_methods.upgrade_saved(metrics_lib.read_json(path)),
          "config")
  return config


def _update(section, values, where):
  for key, value in values.items():
    if key not in section:
      raise config_lib.ConfigError(f"{where}.{key}: unknown key.")
    if isinstance(value, dict):
      _update(section[key], value, f"{where}.{key}")
    else:
      section[key] = value


def run_policy_and_prm(ctx, workdir: str):
  """The policy and trained PRM of a finished run (following init_from).

  The policy is the run's SFT stage (or `sft.init_from`'s); a run without
  one (a PRM trained from a file on `model.hf_path`) has the checkpoint.
  """
  config = run_config(workdir)
  if config.sft.init_from or "sft" in config_lib.stage_names(config):
    policy = load_stage_params(ctx, config.sft.init_from or workdir, "sft",
                               "sft.init_from")
  elif config.model.hf_path:
    _, policy = models.load_hf(
        config.model.hf_path, dtype=config.model.dtype,
        shardings=context_lib.param_shardings(ctx.model_config, ctx.mesh),
        scan_layers=ctx.model_config.scan_layers,
        remat=ctx.model_config.remat)
  else:
    raise config_lib.ConfigError(
        f"{workdir}: the run has neither an sft stage nor a model.hf_path, "
        "so it names no policy.")
  prm, _ = load_finished_prm(ctx, config.prm.init_from or workdir)
  return policy, prm


def label_dir(workdir: str) -> str:
  return os.path.join(workdir, "labels")


def check_config(config, workdir: str):
  """Raises ConfigError, before any stage runs, where the PRM stages would.

  What the labels and prm stages would reject after the stages before them
  had run, checked from the config alone (and the manifest of a finished
  label set it names, never its records): `prm.label_problems` against the
  problems the label set holds, the prm batch against its solutions per
  problem, and that a label set exists for the prm stage to train on.
  """
  stages = config_lib.stage_names(config)
  prm = config.prm
  if config.task.name == "hidden_operands":
    _check_episode_config(config, stages)
  if "prm" not in stages or prm.init_from:
    return
  if prm.data == "file":
    # Each file exists, has a known format and a first row that parses.
    fields = prm_files.file_fields(config)
    for key in ("train_path", "valid_path"):
      if prm[key]:
        try:
          stepwise.check_first_example(prm[key], fields,
                                       config.task.delimiter)
        except errors.InputError as e:
          raise config_lib.ConfigError(f"config.prm.{key}: {e}") from None
    return
  if "labels" in stages and not config.labels.init_from:
    where = "config.labels.num_problems"
    available = config.labels.num_problems
    group_size = config.labels.samples_per_problem
  else:
    key = "labels.init_from" if config.labels.init_from else "stages"
    path = label_dir(config.labels.init_from or workdir)
    try:
      manifest = label_store.read_manifest(path)
    except ValueError as e:
      raise config_lib.ConfigError(
          f"config.{key}: the prm stage needs a complete label set: {e}"
      ) from None
    where = os.path.join(path, label_store.MANIFEST)
    turn_level = config.task.name == "hidden_operands"
    if bool(manifest.get("turn_level", False)) != turn_level:
      raise config_lib.ConfigError(
          f"config.{key}: {where} holds labels of "
          f"{'single-turn solutions' if turn_level else 'episodes'}, but "
          f"config.task.name={config.task.name!r} needs labels of "
          f"{'episodes' if turn_level else 'single-turn solutions'}.")
    group_size = int(manifest["samples_per_problem"])
    available = (int(manifest["num_solutions"]) // group_size
                 if "num_solutions" in manifest else prm.label_problems)
    if prm.batch_size % group_size:
      raise config_lib.ConfigError(
          f"config.prm.batch_size={prm.batch_size} must be a multiple of the "
          f"label set's {group_size} solutions per problem ({where}).")
  if prm.label_problems > available:
    raise config_lib.ConfigError(
        f"config.prm.label_problems={prm.label_problems}: the label set holds "
        f"only {available} problems ({where}); use at most {available}.")


def _check_episode_config(config, stages):
  """What the labels and prm stages support on multi-turn episodes: every
  turn labelled by Monte-Carlo rollouts (`labels.method="mc"`), a score-head
  or generative verifier trained on those labels."""
  if "labels" in stages and not config.labels.init_from:
    if config.labels.method != "mc":
      raise config_lib.ConfigError(
          f"config.labels.method={config.labels.method!r}: episodes are "
          "labelled per turn by Monte-Carlo rollouts; use mc.")
  if "prm" in stages and not config.prm.init_from:
    if config.prm.data != "labels":
      raise config_lib.ConfigError(
          f"config.prm.data={config.prm.data!r}: a turn verifier trains on "
          "the labels stage's episodes; use labels.")
    if config.prm.model not in ("head", "generative"):
      raise config_lib.ConfigError(
          f"config.prm.model={config.prm.model!r}: a turn verifier is a head "
          "or generative verifier on episodes.")


def policy_sampler(ctx, params, *, temperature: float,
                   max_new_tokens: int = 0) -> labels_lib.PolicySampler:
  """A `PolicySampler` on the run's mesh (rows split over the data axes)."""
  task = ctx.task
  return labels_lib.PolicySampler(
      ctx.model_config, params, eos_id=task.tokenizer.stop_ids,
      pad_id=task.tokenizer.pad_id, delimiter_mask=task.delimiter_mask(),
      num_tokens=task.tokenizer.vocab_size,
      max_new_tokens=max_new_tokens or task.max_new_tokens,
      temperature=temperature,
      place=lambda batch: mesh_lib.put_batch(batch, ctx.mesh),
      to_host=mesh_lib.to_host,
      row_multiple=mesh_lib.batch_axis_size(ctx.mesh))


def load_stage_params(ctx, workdir: str, stage: str, key: str):
  """Final parameters of a finished `sft` or `rl` stage of another run
  (`key`: the config key that named `workdir`, for errors)."""
  state, _ = checkpoints.restore_finished(workdir, stage, key)
  params = state["policy"]["params"] if "policy" in state else state["params"]
  return context_lib.place_params(ctx, params,
                                  source=f"config.{key}: {workdir}")


# ---------------------------------------------------------------- labels ---


def oracle_fields(task, solutions):
  if not getattr(task, "has_step_labels", False):
    return [(None, None)] * len(solutions)
  scored = task.score([s.problem for s in solutions],
                      [s.text for s in solutions],
                      np.ones((len(solutions),), bool))
  return [([bool(x) for x in labels], int(first)) for labels, first in
          zip(scored.step_labels, scored.first_error)]


def label_shard(ctx, policy, prover, shard: int) -> tuple[list, dict]:
  """Samples and labels the solutions of one shard; returns records, stats."""
  cfg, task = ctx.config.labels, ctx.task
  first = shard * cfg.problems_per_shard
  count = min(cfg.problems_per_shard, cfg.num_problems - first)
  start = LABEL_INDEX_OFFSET + first
  problems = task.problems("train", start, count)
  tokens, mask = task.encode_prompts(problems)
  prompts = labels_lib.response_rows(tokens, mask)
  n = cfg.samples_per_problem
  samples = policy.sample(tokens, mask, ctx.rng("labels/solutions", shard),
                          num_samples=n)
  rows = [i for i in range(count) for _ in range(n)]
  solutions = labels_lib.solutions_from_samples(
      task, [problems[i] for i in rows], ["train"] * len(rows),
      [start + i for i in rows], [prompts[i] for i in rows], samples)
  records, stats = labels_lib.LABEL_METHODS[cfg.method](
      prover, task, solutions, num_rollouts=cfg.num_rollouts,
      rng=ctx.rng("labels/rollouts", shard),
      batch_size=cfg.prefix_batch_size,
      prompt_width=task.max_prompt_len, response_budget=task.max_new_tokens)
  out = []
  for solution, record, (oracle, first_error) in zip(
      solutions, records, oracle_fields(task, solutions)):
    out.append(dict(
        split=solution.split, index=solution.index,
        question=task.prompts([solution.problem])[0],
        prompt_ids=[int(t) for t in solution.prompt_ids],
        response_ids=[int(t) for t in solution.response_ids],
        text=solution.text, finished=solution.finished,
        outcome=solution.outcome, oracle=oracle, first_error=first_error,
        **record))
  stats["sampled_tokens"] = int(samples["lengths"].sum())
  return out, stats


def label_episode_shard(ctx, policy, prover, shard: int) -> tuple[list, dict]:
  """`label_shard` for a multi-turn task: episodes labelled per turn
  (`labels.label_episodes`), records with `turn_ids`."""
  cfg = ctx.config.labels
  first = shard * cfg.problems_per_shard
  count = min(cfg.problems_per_shard, cfg.num_problems - first)
  start = LABEL_INDEX_OFFSET + first
  return labels_lib.label_episodes(
      ctx.task, policy, prover, ctx.task.problems("train", start, count),
      "train", range(start, start + count),
      samples_per_problem=cfg.samples_per_problem,
      num_rollouts=cfg.num_rollouts, batch_size=cfg.prefix_batch_size,
      sample_rng=ctx.rng("labels/solutions", shard),
      rollout_rng=ctx.rng("labels/rollouts", shard))


def label_statistics(records) -> dict:
  """Summary statistics of label records (agreement with the oracle too)."""
  q = np.array([x for r in records for x in r["q"] if x is not None
                and not np.isnan(x)], np.float64)
  hard = np.array([x for r in records for x in r["hard"]], np.float64)
  stats = {
      "labels/solutions": len(records),
      "labels/steps": int(hard.size),
      "labels/outcome_mean": float(np.mean([r["outcome"] for r in records])),
      "labels/q_mean": float(q.mean()) if q.size else float("nan"),
      "labels/hard_positive": float(hard.mean()),
      "labels/v_mean": float(np.nanmean(
          [np.nan if r["v"] is None else r["v"] for r in records])),
  }
  with_oracle = [r for r in records if r["oracle"] is not None]
  if with_oracle:
    oracle = np.array([x for r in with_oracle for x in r["oracle"]], bool)
    hard_o = np.array([x for r in with_oracle for x in r["hard"]]) > 0.5
    first_mc = [next((k for k, h in enumerate(r["hard"]) if h < 0.5), -1)
                for r in with_oracle]
    stats["labels/hard_vs_oracle"] = float(np.mean(hard_o == oracle))
    stats["labels/first_error_vs_oracle"] = float(np.mean(
        [f == r["first_error"] for f, r in zip(first_mc, with_oracle)]))
    # How well Q-hat itself ranks correct steps above wrong ones: the most a
    # verifier fitted to these labels can show against the step checker.
    pairs = [(q, o) for r in with_oracle for q, o in zip(r["q"], r["oracle"])
             if q is not None and not np.isnan(q)]
    if pairs and 0 < sum(o for _, o in pairs) < len(pairs):
      q_steps, o_steps = (np.array(x) for x in zip(*pairs))
      stats["labels/q_auroc_vs_oracle"] = prm_eval_lib.auroc(
          q_steps.astype(np.float64), o_steps.astype(bool))
  return stats


def run_labels(ctx, policy_params) -> tuple[str, dict]:
  """Runs (or resumes, or reuses) the labelling stage.

  Returns:
    (the label directory, the label set's statistics).
  """
  cfg = ctx.config.labels
  if cfg.init_from:
    path = label_dir(cfg.init_from)
    try:
      manifest = label_store.read_manifest(path)
    except ValueError as e:
      raise config_lib.ConfigError(f"config.labels.init_from: {e}") from None
    print(f"[labels] reusing the label set of {cfg.init_from} "
          f"({manifest['num_solutions']} solutions)")
    return path, {"labels/solutions": manifest["num_solutions"]}
  path = label_dir(ctx.workdir)
  ckpt = ctx.checkpointer(LABELS_STAGE)
  done = ckpt.done_info()
  if done is not None:
    ckpt.close()
    print(f"[labels] reusing the finished stage ({path})")
    return path, done["summary"]
  num_shards = -(-cfg.num_problems // cfg.problems_per_shard)
  if metrics_lib.is_primary():
    label_store.remove_partial_files(path)
  finished = set(label_store.complete_shards(path))
  resume_from = 0
  while resume_from in finished:
    resume_from += 1
  if finished:
    ctx.writer.drop_after(ctx.stage_order, LABELS_STAGE, resume_from)
    print(f"[labels] resuming after {len(finished)} complete shards")
  prover_params = policy_params
  if cfg.prover == "checkpoint":
    prover_params = load_stage_params(ctx, cfg.prover_from, cfg.prover_stage,
                                      "labels.prover_from")
  if getattr(ctx.task, "multi_turn", False):
    policy, prover = (labels_lib.EpisodeProver(
        ctx.task, ctx.model_config, params, temperature=cfg.temperature)
                      for params in (policy_params, prover_params))
    labeller = label_episode_shard
  else:
    policy = policy_sampler(ctx, policy_params, temperature=cfg.temperature)
    prover = policy_sampler(ctx, prover_params, temperature=cfg.temperature)
    labeller = label_shard
  for shard in range(num_shards):
    if shard in finished:
      continue
    t0 = time.time()
    records, stats = labeller(ctx, policy, prover, shard)
    seconds = time.time() - t0
    record = label_statistics(records)
    record.update({"labels/prefixes": stats["prefixes"],
                   "labels/rollouts": stats["rollouts"],
                   "labels/generated_tokens": stats["generated_tokens"],
                   "labels/sampled_tokens": stats["sampled_tokens"],
                   "time/shard_s": seconds,
                   "perf/tokens_per_sec": (stats["generated_tokens"] +
                                           stats["sampled_tokens"]) /
                                          max(seconds, 1e-9)})
    ctx.writer.write(LABELS_STAGE, shard + 1, record)
    # After its metrics record, so a complete shard has one; the position
    # tells a resumed run which records to keep (`runners/resume.py`).
    resume.record_shard_position(ctx, shard)
    if metrics_lib.is_primary():  # Every process holds the same records.
      label_store.write_shard(path, shard, records)
    metrics_lib.print_status(metrics_lib.format_status(
        LABELS_STAGE, shard + 1, num_shards, record,
        ("labels/solutions", "labels/q_mean", "labels/hard_positive",
         "labels/hard_vs_oracle", "labels/rollouts", "time/shard_s")))
  mesh_lib.sync_processes("labels: shards written")
  records = label_store.read_shards(path, num_shards)
  summary = label_statistics(records)
  summary["labels/path"] = path
  if metrics_lib.is_primary():
    label_store.write_manifest(path, {
        "num_shards": num_shards, "num_solutions": len(records),
        "samples_per_problem": cfg.samples_per_problem,
        "num_rollouts": cfg.num_rollouts, "method": cfg.method,
        "prover": cfg.prover, "prover_k": cfg.prover_k,
        "prover_from": cfg.prover_from,
        "delimiter": ctx.config.task.delimiter,
        # Steps are the episodes' turns (records carry `turn_ids`).
        "turn_level": bool(getattr(ctx.task, "multi_turn", False)),
        "prompt_width": ctx.task.max_prompt_len,
        "response_budget": ctx.task.max_new_tokens})
  ctx.writer.write(LABELS_STAGE, num_shards, summary)
  ckpt.mark_done(num_shards, summary)
  ckpt.close()
  mesh_lib.sync_processes("labels: manifest written")
  return path, summary


# ------------------------------------------------------------------- prm ---


@dataclasses.dataclass
class TrainedPRM:
  """A trained verifier, as `run_prm_train` returns it.

  Attributes:
    kind: "head" (score-head PRM/PAV), "generative" (LM head as the step
      verifier, score head for V) or "implicit".
    params: the model's parameters.
    reference: the implicit PRM's reference policy (None for "head").
    beta: the implicit PRM's β.
  """
  kind: str
  params: Any
  reference: Any = None
  beta: float = 0.0


def load_scorer(ctx, prm: TrainedPRM):
  """The scorer of a trained PRM (`programs.scorer`); `score_rollout` is what
  RL calls. It scores `config_lib.pass_micro_batch_size(config.prm)` rows at
  a time, the LM head in `config.model.logits_chunk` chunks."""
  return programs.scorer(ctx.config, ctx.model_config, prm.kind, prm.params,
                         prm.reference, prm.beta)


def rl_verifier(ctx, prm: TrainedPRM, summary: dict) -> method_base.Verifier:
  """A trained PRM as the RL stage's methods see it: its scorer and what it
  was trained on (`summary`: the prm stage's, which records the model, the
  target, the prover's K and the value weight)."""
  model = summary["prm/model"]
  return method_base.Verifier(
      scorer=load_scorer(ctx, prm), model=model,
      target="outcome" if model == "implicit" else summary["prm/target"],
      prover_k=int(summary.get("prm/prover_k", 1)),
      value_trained=float(summary.get("prm/value_weight", 1.0)) > 0)


def _label_set_path(ctx, label_set_path):
  if label_set_path:
    return label_set_path
  if ctx.config.labels.init_from:
    return label_dir(ctx.config.labels.init_from)
  return label_dir(ctx.workdir)


def _layer_layout(model_config, params):
  """Saved parameters in this run's block layout (`model.scan_layers`): a
  PRM trained with per-layer blocks serves a scanned run, and back."""
  if model_config.scan_layers and "layers_0" in params:
    return models.stack_layers(model_config, params)
  if not model_config.scan_layers and "layers" in params:
    return models.unstack_layers(model_config, params)
  return params


def load_finished_prm(ctx, workdir: str):
  """The trained PRM and summary of a finished prm stage of `workdir`."""
  state, done = checkpoints.restore_finished(workdir, PRM_STAGE,
                                            "prm.init_from")
  meta = done["summary"]
  trained_on = meta.get("prm/delimiter")
  if trained_on is not None and trained_on != ctx.config.task.delimiter:
    raise config_lib.ConfigError(
        f"config.prm.init_from: the PRM of {workdir} was trained on steps cut "
        f"at {trained_on!r}, but config.task.delimiter is "
        f"{ctx.config.task.delimiter!r}; its step scores would be read at "
        "other positions. Use the same delimiter.")
  kind = meta["prm/model"]
  heads = MODEL_HEADS[kind]
  source = f"config.prm.init_from: {workdir}"
  params = context_lib.place_params(
      ctx, _layer_layout(ctx.model_config, state["prm"]["params"]), heads,
      source=source)
  reference = (context_lib.place_params(
      ctx, _layer_layout(ctx.model_config, state["reference"]),
      source=source) if kind == "implicit" else None)
  print(f"[prm] reusing the trained {kind} PRM of {workdir} "
        f"(step {done['step']})")
  return (TrainedPRM(kind, params, reference, float(meta["prm/beta"])),
          dict(meta, **{"prm/init_from": workdir}))


# The heads of each PRM model's parameters.
MODEL_HEADS = {"head": ("score",), "generative": ("lm", "score"),
               "implicit": ("lm",)}


def _split_groups(num_groups: int, valid_fraction: float):
  num_valid = int(round(num_groups * valid_fraction))
  num_valid = min(num_valid, num_groups - 1)
  return np.arange(num_groups - num_valid), np.arange(num_groups - num_valid,
                                                      num_groups)


def _rows_of(groups, group_size):
  return (np.asarray(groups)[:, None] * group_size +
          np.arange(group_size)[None, :]).ravel()


def _ref_logprobs(ctx, params, arrays, batch_size):
  fn = programs.logprob_pass(ctx.config, ctx.model_config, "prm")
  out = []
  for start in range(0, arrays["tokens"].shape[0], batch_size):
    rows = slice(start, start + batch_size)
    out.append(np.asarray(fn(params, arrays["tokens"][rows],
                             arrays["attention_mask"][rows])))
  return np.concatenate(out)


def _prm_batch(arrays, rows, kind):
  keys = (("tokens", "attention_mask", "step_ids", "targets", "target_mask",
           "v_target", "v_mask") if kind != "implicit" else
          ("tokens", "attention_mask", "response_mask", "ref_logprobs"))
  batch = {k: arrays[k][rows] for k in keys}
  if kind == "implicit":
    batch["labels"] = arrays["outcome"][rows]
  return batch


def _validation_metrics(ctx, prm: TrainedPRM, arrays, rows) -> dict:
  """Step AUROC and ProcessBench F1 (τ = ½) of the PRM on held-out labels."""
  if not len(rows):
    return {}
  scorer = load_scorer(ctx, prm)
  batch = scoring.SolutionBatch(
      tokens=arrays["tokens"][rows],
      attention_mask=arrays["attention_mask"][rows],
      step_ids=arrays["step_ids"][rows], num_steps=ctx.config.task.max_steps)
  scores = scorer.score_batch(batch)
  out = {}
  mc_mask = arrays["target_mask"][rows] & scores["step_mask"]
  if mc_mask.any():
    out["prm/valid_auroc_vs_labels"] = prm_eval_lib.auroc(
        scores["step_scores"][mc_mask],
        arrays["targets"][rows][mc_mask] >= 0.5)
    out["prm/valid_abs_error"] = float(np.mean(np.abs(
        scores["step_scores"][mc_mask] - arrays["targets"][rows][mc_mask])))
  oracle_mask = arrays["oracle_mask"][rows] & scores["step_mask"]
  if oracle_mask.any():
    out["prm/valid_auroc_vs_oracle"] = prm_eval_lib.auroc(
        scores["step_scores"][oracle_mask],
        arrays["oracle"][rows][oracle_mask])
    predictions = prm_eval_lib.first_error_predictions(
        scores["step_scores"], scores["step_mask"], 0.5)
    out["prm/valid_f1_at_half"] = prm_eval_lib.processbench_metrics(
        arrays["first_error"][rows], predictions)["f1"]
  return out


@dataclasses.dataclass
class TrainingData:
  """The label records a PRM trains on, and how they split.

  Attributes:
    records: label records (`label_store`), groups of `group_size`
      solutions of one problem contiguous.
    group_size: solutions per problem (1 for file rows).
    prover_k: K of a Best-of-K prover's labels (1 otherwise).
    train_groups: indices of the training groups.
    valid_groups: indices of the held-out groups.
    info: summary entries describing the data.
  """
  records: list
  group_size: int
  prover_k: int
  train_groups: np.ndarray
  valid_groups: np.ndarray
  info: dict


def _label_set_training_data(ctx, label_set_path) -> TrainingData:
  """The Monte-Carlo label set of the labels stage (or labels.init_from)."""
  cfg = ctx.config.prm
  path = _label_set_path(ctx, label_set_path)
  try:
    manifest, records = label_store.read_label_set(path)
  except ValueError as e:
    raise config_lib.ConfigError(
        f"the prm stage needs a complete label set: {e}") from None
  group_size = int(manifest["samples_per_problem"])
  if len(records) % group_size:
    raise ValueError(f"{path}: {len(records)} solutions are not whole groups "
                     f"of {group_size}.")
  if cfg.label_problems:
    available = len(records) // group_size
    if cfg.label_problems > available:
      raise config_lib.ConfigError(
          f"config.prm.label_problems={cfg.label_problems}: the label set "
          f"{path} holds only {available} problems.")
    records = records[:cfg.label_problems * group_size]
  if cfg.batch_size % group_size:
    raise config_lib.ConfigError(
        f"config.prm.batch_size={cfg.batch_size} must be a multiple of the "
        f"label set's {group_size} solutions per problem.")
  prover_k = int(manifest["prover_k"]) if manifest["prover"] == "best_of_k" \
      else 1
  train_groups, valid_groups = _split_groups(len(records) // group_size,
                                             cfg.valid_fraction)
  return TrainingData(records, group_size, prover_k, train_groups,
                      valid_groups, {})


def _file_training_data(ctx) -> TrainingData:
  """`prm.train_path` (its first `prm.label_problems` rows, 0: all) and the
  held-out `prm.valid_path`, else a `prm.valid_fraction` of the train rows;
  every row is its own group."""
  cfg = ctx.config.prm
  records = prm_files.file_label_records(ctx, "train_path")
  if cfg.label_problems:
    if cfg.label_problems > len(records):
      raise config_lib.ConfigError(
          f"config.prm.label_problems={cfg.label_problems}: "
          f"{cfg.train_path} holds only {len(records)} rows.")
    records = records[:cfg.label_problems]
  if cfg.valid_path:
    valid = prm_files.file_label_records(ctx, "valid_path")
    train_groups = np.arange(len(records))
    valid_groups = np.arange(len(records), len(records) + len(valid))
    records = records + valid
  else:
    train_groups, valid_groups = _split_groups(len(records),
                                               cfg.valid_fraction)
  info = {"prm/label_problems": len(train_groups),
          "prm/train_rows": len(train_groups),
          "prm/valid_rows": len(valid_groups),
          "prm/train_path": cfg.train_path}
  print(f"[prm] {len(train_groups)} training and {len(valid_groups)} held-out "
        f"solutions from {cfg.train_path}"
        + (f" and {cfg.valid_path}" if cfg.valid_path else ""))
  return TrainingData(records, 1, 1, train_groups, valid_groups, info)


def run_prm_train(ctx, policy_params, label_set_path=None):
  """Runs (or resumes, or reuses) PRM training; returns (TrainedPRM, summary).

  Args:
    ctx: the run context.
    policy_params: the policy (backbone of a head PRM, reference and
      initialisation of an implicit one).
    label_set_path: the label directory (None: `labels.init_from`'s, else
      this workdir's); unused with `prm.data="file"`.
  """
  cfg = ctx.config.prm
  if cfg.init_from:
    return load_finished_prm(ctx, cfg.init_from)
  if cfg.data == "file":
    data = _file_training_data(ctx)
  else:
    data = _label_set_training_data(ctx, label_set_path)
  records, group_size, prover_k = data.records, data.group_size, data.prover_k
  train_groups, valid_groups = data.train_groups, data.valid_groups
  task = ctx.task
  num_steps = ctx.config.task.max_steps
  mesh_lib.check_batch_divides(cfg.batch_size, ctx.mesh, "config.prm")
  if cfg.micro_batch_size:
    mesh_lib.check_batch_divides(cfg.micro_batch_size, ctx.mesh,
                                 "config.prm.micro_batch_size")
  arrays = training.label_arrays(
      records, prompt_width=task.max_prompt_len,
      response_budget=task.max_new_tokens, num_steps=num_steps,
      delimiter_mask=task.delimiter_mask(), eos_id=task.tokenizer.stop_ids,
      pad_id=task.tokenizer.pad_id, target=cfg.target, prover_k=prover_k,
      progress_ratio=cfg.progress_ratio,
      drop_after_first_negative=cfg.drop_after_first_negative)
  groups_per_batch = cfg.batch_size // group_size
  kind = cfg.model
  tx = programs.prm_optimizer(cfg)
  host_policy = jax.device_get(policy_params)
  heads = MODEL_HEADS[kind]
  if kind != "implicit":
    init = models.init_from_backbone(ctx.model_config, host_policy,
                                     ctx.rng("prm_init"), heads=heads)
    step_fn = programs.prm_step_fn(ctx.config, ctx.model_config, tx,
                                   kind=kind, group_size=group_size)
  else:
    init = host_policy
    arrays["ref_logprobs"] = _ref_logprobs(ctx, policy_params, arrays,
                                           cfg.batch_size)
    step_fn = programs.prm_step_fn(ctx.config, ctx.model_config, tx,
                                   kind=kind, group_size=group_size)
  prm_state, prm_shardings = context_lib.create_state(
      ctx.model_config, ctx.mesh, init, tx, heads=heads)
  state, shardings = {"prm": prm_state}, {"prm": prm_shardings}
  if kind == "implicit":
    state["reference"] = context_lib.place_params(ctx, host_policy)
    shardings["reference"] = context_lib.param_shardings(ctx.model_config,
                                                         ctx.mesh)
  ckpt = ctx.checkpointer(PRM_STAGE)
  meta = {"seconds": 0.0, "skip_run": 0, "last_record": {}}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    step = int(state["prm"].step)
    if done is not None and done["step"] == step:
      ckpt.close()
      print(f"[prm] reusing the finished stage (step {step})")
      return (TrainedPRM(kind, state["prm"].params, state.get("reference"),
                         cfg.implicit_beta), done["summary"])
    ctx.writer.drop_after(ctx.stage_order, PRM_STAGE, step)
    print(f"[prm] resuming from step {step}")
  jit_step = programs.jit_update(step_fn, shardings["prm"], ctx.mesh)
  step = int(state["prm"].step)
  seconds = float(meta["seconds"])
  last = time.time()
  # The last logged record goes into the summary: kept in the checkpoint, so
  # a run resumed from the final checkpoint has it too.
  record = dict(meta.get("last_record", {}))
  guard = nonfinite.SkipGuard(PRM_STAGE,
                              ctx.config.train.max_consecutive_skips,
                              run=int(meta.get("skip_run", 0)))
  while step < cfg.steps:
    groups = train_groups[order.epoch_order(
        len(train_groups), groups_per_batch, ctx.config.seed, step)]
    batch = mesh_lib.put_batch(
        _prm_batch(arrays, _rows_of(groups, group_size), kind), ctx.mesh)
    state["prm"], step_metrics = jit_step(state["prm"], batch)
    step += 1
    guard.observe(step, step_metrics["skipped"])
    if step % cfg.log_every_steps == 0 or step == cfg.steps:
      values = context_lib.host_scalars(step_metrics)
      now = time.time()
      seconds += now - last
      last = now
      record = {f"train/{k}": v for k, v in values.items()}
      record["train/skipped_updates"] = int(state["prm"].skipped)
      record["time/train_s"] = seconds
      ctx.writer.write(PRM_STAGE, step, record)
      metrics_lib.print_status(metrics_lib.format_status(
          PRM_STAGE, step, cfg.steps, record,
          ("train/prm_loss", "train/step_accuracy",
           "train/pairwise_accuracy", "time/train_s")))
    if step % cfg.checkpoint_every_steps == 0 or step == cfg.steps:
      meta.update(seconds=seconds, skip_run=guard.flush(),
                  last_record=record)
      ckpt.save(step, state, meta)
  guard.flush()
  prm = TrainedPRM(kind, state["prm"].params, state.get("reference"),
                   cfg.implicit_beta)
  summary = {k: v for k, v in record.items()}
  summary.update(_validation_metrics(
      ctx, prm, arrays, _rows_of(valid_groups, group_size)))
  summary.update({"prm/steps": step, "prm/seconds": seconds,
                  "prm/model": kind, "prm/target": cfg.target,
                  "prm/prover_k": prover_k if cfg.target == "prover" else 1,
                  # A file has no V-hat labels: V(question) is not trained.
                  "prm/value_weight": (0.0 if cfg.data == "file" else
                                       cfg.value_weight),
                  "prm/beta": cfg.implicit_beta,
                  "prm/label_problems": len(records) // group_size,
                  "prm/train_solutions": len(train_groups) * group_size,
                  "prm/skipped_updates": int(state["prm"].skipped),
                  "prm/data": cfg.data,
                  # Step boundaries the PRM was trained on; a run scoring
                  # with it must cut steps the same way (load_finished_prm).
                  "prm/delimiter": ctx.config.task.delimiter})
  summary.update(data.info)
  ctx.writer.write(PRM_STAGE, step, {k: v for k, v in summary.items()
                                     if not isinstance(v, str)})
  ckpt.mark_done(step, summary)
  ckpt.close()
  return prm, summary
