"""The run: validate the config, build the context, run the stages in order.

    summary = pipeline.run(config, workdir)

Stages run in the order of `config.stages` and are cached in the workdir: a
finished stage is reused from its final checkpoint, an unfinished one resumes
from its latest checkpoint (its metrics records after that point dropped
first: `runners/resume.py`), so rerunning with the same workdir continues
where the last run stopped. `summary.json` is written last. One run at a
time holds the workdir (`runners/lock.py`).
"""

import json
import os
import time

import jax

from rl_rewards import config_data
from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards import progress
from rl_rewards import reports
from rl_rewards.models import hf as hf_lib
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import lock as lock_lib
from rl_rewards.runners import prm_eval
from rl_rewards.runners import prm_stages
from rl_rewards.runners import methods
from rl_rewards.runners import resume
from rl_rewards.runners import rl
from rl_rewards.runners import sft
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.tasks import tokenizer as tokenizer_lib


def _hf_tokenizer(config):
  path = config.model.tokenizer_path or (
      os.path.join(config.model.hf_path, "tokenizer.json")
      if config.model.hf_path else "")
  if not path:
    return None
  if not os.path.exists(path):
    raise config_lib.ConfigError(f"config.model: no tokenizer file {path}.")
  return tokenizer_lib.HFTokenizer(
      path, prompt_template=config.task.prompt_template,
      system_prompt=config.task.system_prompt or None,
      template_kwargs=config.task.chat_template_kwargs)


def _model_config(config, vocab_size):
  if not config.model.hf_path:
    return models.preset(config.model.size, vocab_size,
                         dtype=config.model.dtype,
                         scan_layers=config.model.scan_layers,
                         remat=config.model.remat)
  path = os.path.join(config.model.hf_path, "config.json")
  if not os.path.exists(path):
    raise config_lib.ConfigError(
        f"config.model.hf_path: {config.model.hf_path} has no config.json.")
  return hf_lib.config_from_hf(hf_lib.read_hf_config(path),
                               dtype=config.model.dtype, path=path,
                               scan_layers=config.model.scan_layers,
                               remat=config.model.remat)


def initial_params(ctx):
  """The policy before any stage: a HF checkpoint, or a fresh init."""
  shardings = context_lib.param_shardings(ctx.model_config, ctx.mesh)
  if ctx.config.model.hf_path:
    _, params = models.load_hf(ctx.config.model.hf_path,
                               dtype=ctx.config.model.dtype,
                               shardings=shardings,
                               scan_layers=ctx.model_config.scan_layers,
                               remat=ctx.model_config.remat)
    return params
  params = models.init_params(ctx.model_config, ctx.rng("init"))
  return jax.device_put(params, shardings)


def _mesh_and_rules(config):
  try:
    mesh = mesh_lib.make_mesh(
        {name: config.mesh[name] for name in mesh_lib.axes.MESH_AXES})
  except ValueError as e:
    raise config_lib.ConfigError(f"config.{e}") from None
  try:
    rules = mesh_lib.parse_rules(config.mesh.rules)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  return mesh, rules


def plan_context(config):
  """(model config, mesh, rules) of `config` without loading any weights or
  data: what the memory planner compiles for. A `model.hf_path` needs only
  its config.json; without one the task's tokenizer sets the vocabulary."""
  config_lib.validate(config)
  methods.check_config(config)
  if config.model.hf_path:
    model_config = _model_config(config, vocab_size=None)
  else:
    task = tasks_lib.make_task(config.task, config.seed,
                               tokenizer=_hf_tokenizer(config), workdir="")
    model_config = _model_config(config, task.tokenizer.vocab_size)
  mesh, rules = _mesh_and_rules(config)
  return model_config, mesh, rules


def build_context(config, workdir: str) -> context_lib.RunContext:
  """Validates `config` and builds the shared run context."""
  config_lib.validate(config)
  methods.check_config(config)
  os.makedirs(workdir, exist_ok=True)
  hf_tokenizer = _hf_tokenizer(config)
  if hf_tokenizer is not None and config.model.hf_path:
    # Before any data is prepared: the files disagree.
    _check_vocab(config, hf_tokenizer, _model_config(config, None))
  task = tasks_lib.make_task(config.task, config.seed, tokenizer=hf_tokenizer,
                             workdir=workdir,
                             eval_sets=config_data.eval_sets(config))
  model_config = _model_config(config, task.tokenizer.vocab_size)
  _check_vocab(config, task.tokenizer, model_config)
  task.model_vocab_size = model_config.vocab_size
  needed = config.task.max_prompt_len + config.task.max_new_tokens
  if needed > model_config.max_position_embeddings:
    raise config_lib.ConfigError(
        f"config.task: max_prompt_len + max_new_tokens = {needed} exceeds "
        f"the model context of {model_config.max_position_embeddings}.")
  mesh, rules = _mesh_and_rules(config)
  with mesh_lib.activate(mesh, rules):
    context_lib.check_param_shardings(model_config, mesh)
  resolved = _check_config_file(config, workdir)
  progress.configure(config.logging.progress, config.logging.progress_every_s)
  stage_order = config_lib.stage_names(config)
  return context_lib.RunContext(
      config=config, workdir=workdir, mesh=mesh, task=task,
      model_config=model_config,
      writer=metrics_lib.MetricsWriter(workdir, logging=config.logging,
                                       stage_order=stage_order,
                                       run_config=resolved),
      stage_order=stage_order, rules=rules)


def _check_vocab(config, tokenizer, model_config):
  """The tokenizer's ids must all be rows of the model's embedding."""
  if tokenizer.vocab_size <= model_config.vocab_size:
    return
  where = getattr(tokenizer, "path", "the task's tokenizer")
  key = ("config.model.tokenizer_path" if config.model.tokenizer_path
         else "config.model")
  model = (os.path.join(config.model.hf_path, "config.json")
           if config.model.hf_path else f"the {config.model.size} preset")
  raise config_lib.ConfigError(
      f"{key}: the tokenizer {where} has {tokenizer.vocab_size} tokens, more "
      f"than the vocabulary of the model ({model}: vocab_size "
      f"{model_config.vocab_size}); use the tokenizer made for this model.")


# Keys that may change when a workdir is resumed: budgets (to extend a run),
# how often things are logged and how checkpoints are written; so may the
# whole `logging` section (where metrics are mirrored to, and how progress is
# shown).
RESUMABLE_KEYS = ("sft.max_steps", "sft.max_seconds", "rl.steps",
                  "rl.max_seconds", "sft.log_every_steps", "rl.log_every_steps",
                  "checkpoint.async_save")
RESUMABLE_SECTIONS = ("logging",)


def _resumable(key):
  return key in RESUMABLE_KEYS or key.split(".")[0] in RESUMABLE_SECTIONS


def _check_config_file(config, workdir):
  """Writes config.json, refusing to resume a workdir with another config.

  Only the budgets and logging intervals in `RESUMABLE_KEYS` and the
  `logging` section may differ from the config the workdir was started with
  (e.g. `--config.rl.steps=200` to extend a finished run, or
  `--config.logging.wandb_project=...` to mirror it to W&B from now on).
  Keys added to the schema since the run started are accepted at their
  default values.

  Returns:
    The resolved config as a dict (what config.json holds).
  """
  path = os.path.join(workdir, metrics_lib.CONFIG_FILE)
  resolved = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    # A run written before the methods' keys moved to their sections.
    previous = config_methods.upgrade_saved(metrics_lib.read_json(path))
    defaults = json.loads(config_lib.base_config().to_json_best_effort())
    changed = sorted(
        k for k in _diff_keys(previous, resolved)
        if not _resumable(k) and not _added_at_default(k, previous, resolved,
                                                       defaults))
    if changed:
      raise config_lib.ConfigError(
          f"workdir {workdir} holds a run with a different config (changed: "
          f"{', '.join(changed[:8])}); use a new --workdir to start another "
          "run.")
  metrics_lib.write_config(workdir, resolved)
  return resolved


_MISSING = object()


def _lookup(tree, dotted):
  for part in dotted.split("."):
    if not isinstance(tree, dict) or part not in tree:
      return _MISSING
    tree = tree[part]
  return tree


def _added_at_default(key, previous, resolved, defaults):
  """A key the workdir's config.json lacks (the schema gained it since the
  run started) is no change while it holds its default: every new key's
  default keeps the behaviour the code had before the key existed."""
  return (_lookup(previous, key) is _MISSING and
          _lookup(resolved, key) == _lookup(defaults, key))


def _diff_keys(a, b, prefix=""):
  for key in set(a) | set(b):
    va, vb = a.get(key), b.get(key)
    if isinstance(va, dict) and isinstance(vb, dict):
      yield from _diff_keys(va, vb, f"{prefix}{key}.")
    elif va != vb:
      yield f"{prefix}{key}"


def check_stages(config, workdir: str):
  """Raises ConfigError for what a stage would reject once the stages
  before it had run, when the config alone decides it: bad values fail
  before any work."""
  stages = config_lib.stage_names(config)
  if "sft_continue" in stages and config.sft.continue_seconds <= 0:
    raise config_lib.ConfigError(
        "config.sft.continue_seconds must be > 0 for the sft_continue stage.")
  if "rl" in stages:
    method = methods.make(config)
    if (method.reads_step_scores and config.rl.prm_source == "model" and
        "prm" not in stages and not config.prm.init_from):
      raise config_lib.ConfigError(
          f"config.rl.method={config.rl.method!r} with prm_source='model' "
          "needs a trained verifier: add the 'labels' and 'prm' stages, or "
          "set config.prm.init_from, or use config.rl.prm_source='oracle'.")
  prm_stages.check_config(config, workdir)


def run(config, workdir: str) -> dict:
  """Runs every stage of `config` in `workdir`; returns the summary dict.

  Everything runs inside `mesh_lib.activate(mesh, rules)`, so the logical
  sharding of activations takes effect in every jitted function.
  """
  start = time.time()
  config_lib.validate(config)
  check_stages(config, workdir)
  with lock_lib.hold(workdir):
    ctx = build_context(config, workdir)
    try:
      with mesh_lib.activate(ctx.mesh, ctx.rules):
        return _run_stages(ctx, config, workdir, start)
    finally:
      # Flushes the live views (TensorBoard, W&B) also when a stage fails.
      ctx.writer.close()


def _run_stages(ctx, config, workdir, start):
  print(f"rl_rewards: workdir {os.path.abspath(workdir)}; stages "
        f"{' -> '.join(ctx.stage_order)}; model "
        f"{config.model.hf_path or config.model.size} "
        f"({models.num_params(ctx.model_config):,} parameters); mesh "
        f"{dict(ctx.mesh.shape)}", flush=True)
  stage_summaries, stage_seconds = {}, {}
  params = sft_params = None
  label_path, prm_params, verifier = None, None, None
  if ctx.stage_order[0] != "sft" or not config.sft.init_from:
    # The policy every stage starts from (reused SFT policies are loaded by
    # the sft stage itself).
    params = sft_params = initial_params(ctx)
  for stage in ctx.stage_order:
    t0 = time.time()
    resume.rewind_metrics(ctx, stage)
    if stage == "sft":
      params, summary = sft.run(ctx, params)
      sft_params = params
    elif stage in ("labels", "prm", "prm_eval"):
      if sft_params is None:
        raise config_lib.ConfigError(
            f"config.stages: the {stage} stage needs the sft stage before it.")
      if stage == "labels":
        label_path, summary = prm_stages.run_labels(ctx, sft_params)
      elif stage == "prm":
        prm_params, summary = prm_stages.run_prm_train(ctx, sft_params,
                                                       label_path)
        verifier = prm_stages.rl_verifier(ctx, prm_params, summary)
      else:
        summary = prm_eval.run_prm_eval(ctx, sft_params, prm_params)
    elif stage == "rl":
      if params is None:
        raise config_lib.ConfigError(
            "config.stages: the rl stage needs a policy; run sft first.")
      if verifier is None and config.prm.init_from:
        # A verifier trained by another run (`prm.init_from`).
        prm_params, prm_summary = prm_stages.load_finished_prm(
            ctx, config.prm.init_from)
        verifier = prm_stages.rl_verifier(ctx, prm_params, prm_summary)
      params, summary = rl.run(ctx, params, ref_params=sft_params,
                               verifier=verifier)
    elif stage == "sft_continue":
      if sft_params is None:
        raise config_lib.ConfigError(
            "config.stages: sft_continue needs the sft stage before it.")
      _, summary = sft.run_continue(ctx, sft_params)
    else:  # validate() rejects unknown stages; keep the error explicit.
      raise config_lib.ConfigError(f"config.stages: unknown stage {stage!r}.")
    stage_summaries[stage] = summary
    stage_seconds[stage] = time.time() - t0
  ctx.writer.close()
  summary = {"stages": stage_summaries, "wall_time_s": time.time() - start,
             "stage_time_s": stage_seconds}
  metrics_lib.write_summary(workdir, summary)
  _print_summary(summary)
  return summary


def _print_summary(summary):
  """Held-out accuracy of each stage, the RL gain, verifier quality, time."""
  print(reports.summary_text(summary), flush=True)
