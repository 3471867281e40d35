"""The RL stage: rollout → signals → advantages → updates → log.

One RL step:
  1. rollout: `prompts_per_step` fresh train problems, `group_size` samples
     each (the n samples of a prompt are contiguous rows); decode, score
     with the task's verifier (outcome reward) and its step checker
     (ground-truth step labels: the oracle, and the diagnostics); the
     accuracy filter's row weights multiply the response mask from here on.
     A multi-turn task (`task.multi_turn`) rolls out episodes instead
     (`rollout_episodes`: observations masked out of every loss, turns as
     steps); the phases after the rollout are the same;
  2. signals: π_old (`rl.old_logprobs`), the reference log-probs, the
     verifier's (or the oracle's) step scores (`runners/step_scores.py`),
     then the method's own signal (`methods.make(config)`, e.g. PRIME's
     implicit PRM, which learns here, or PPO's values);
  3. advantages: the method's pure advantage function, jitted once;
  4. updates: `epochs` passes of `minibatches` PPO-clip policy steps, each
     followed by the method's extra update (PPO's critic);
  5. log: rollout statistics, the averaged update metrics of every
     minibatch, and where the signal is (`runners/rl_metrics.py`).

`run` reads top to bottom: the method and its checks, the state of every
trained model, the programs (the policy update and the method's own, each
declared once in `programs` or the method's module, which the memory
planner compiles too), then the loop of the five phases.

Everything random is keyed by (seed, step) and the prompts of step s are a
pure function of s, so a resumed run reproduces an uninterrupted one exactly.
With several processes, each one builds, decodes and scores only its own rows
of the rollout (whole groups: `mesh.process_rows`); rewards and step labels
go back on the mesh as global arrays, and rollout metrics are combined from
per-process sums, so every process logs the numbers of a single-process run.
The checkpointed state holds every trained model (`policy`, and `value` or
`implicit_prm`, and `verifier` when `rl.verifier_refresh_lr` refreshes the
verifier on each rollout: `runners/verifier_refresh.py`) with its own
optimizer state.
"""

import time

import jax
import numpy as np

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards import metrics as metrics_lib
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import evaluation
from rl_rewards.runners import methods as methods_lib
from rl_rewards.runners import programs
from rl_rewards.runners import rl_metrics
from rl_rewards.runners import step_scores
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.runners import verifier_refresh
from rl_rewards.runners.methods import base as method_base
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import nonfinite

STAGE = "rl"


def rollout_problems(ctx, step: int, rows: slice = slice(None)):
  """Prompts `rows` (default: all) of the rollout of `step`."""
  cfg = ctx.config.rl
  start, stop, _ = rows.indices(cfg.prompts_per_step)
  first = tasks_lib.RL_INDEX_OFFSET + step * cfg.prompts_per_step + start
  return ctx.task.problems("train", first, stop - start)


def rollout_rows(ctx) -> tuple[slice, slice]:
  """This process's (prompt rows, sample rows) of a rollout batch.

  The n = `group_size` samples of prompt i are rows n·i … n·i + n − 1, and
  both batches split evenly over the same devices, so a process's sample
  rows are exactly the groups of its prompts.
  """
  cfg = ctx.config.rl
  prompts = mesh_lib.process_rows(cfg.prompts_per_step, ctx.mesh)
  samples = mesh_lib.process_rows(cfg.prompts_per_step * cfg.group_size,
                                  ctx.mesh)
  n = cfg.group_size
  if (samples.start, samples.stop) != (prompts.start * n, prompts.stop * n):
    raise ValueError(f"rollout rows {samples} are not the groups of this "
                     f"process's prompts {prompts}.")
  return prompts, samples


def rollout(ctx, params, step: int):
  """Samples and scores the rollout batch of `step`: this process's rows.

  The process encodes its own prompts only, reads back its own sampled rows
  (`mesh.local_rows`, no all-gather) and decodes and scores them.

  Returns:
    (sample output: global [B] arrays on device; this process's verdicts on
    host (`Scored` of rows `rollout_rows(ctx)[1]`); host info dict with
    `lengths` [R] of those rows, `rows` (their slice), `num_tokens` (over all
    processes) and `reward_s`, the scoring time).
  """
  cfg = ctx.config.rl
  task = ctx.task
  prompt_rows, rows = rollout_rows(ctx)
  problems = rollout_problems(ctx, step, prompt_rows)
  tokens, mask = mesh_lib.put_local_batch(
      task.encode_prompts(problems), ctx.mesh, cfg.prompts_per_step)
  out = sampler.sample(
      ctx.model_config, params, tokens, mask, ctx.rng("rollout", step),
      max_new_tokens=task.max_new_tokens, temperature=cfg.temperature,
      top_p=cfg.top_p, eos_id=task.tokenizer.stop_ids,
      pad_id=task.tokenizer.pad_id, delimiter_mask=task.delimiter_mask(),
      num_samples=cfg.group_size, num_tokens=task.tokenizer.vocab_size)
  host = mesh_lib.local_rows({"tokens": out.tokens,
                              "response_mask": out.response_mask,
                              "truncated": out.truncated,
                              "lengths": out.lengths}, ctx.mesh)
  t0 = time.time()
  texts = task.decode_responses(host["tokens"], host["response_mask"])
  repeated = [p for p in problems for _ in range(cfg.group_size)]
  scored = task.score(repeated, texts, ~host["truncated"])
  reward_s = time.time() - t0
  num_tokens = mesh_lib.process_sums({"tokens": host["lengths"].sum()})
  info = {"lengths": host["lengths"], "rows": rows,
          "num_tokens": int(num_tokens["tokens"]), "reward_s": reward_s,
          "verifier": rl_metrics.verifier_metrics(task)}
  return out, scored, info


def rollout_episodes(ctx, params, step: int):
  """`rollout` for a multi-turn task (`task.multi_turn`): episodes.

  The task samples the episodes (`rollout.episodes.sample_episodes`: the KV
  cache kept across turns, the environment's observations appended as
  tokens) and the batch gets the keys of a single-turn rollout: the
  episode's tokens as sampled, `response_mask` 1 on the policy's tokens
  only (observations are context: no loss, KL or entropy on them), and the
  turn ids as `step_ids`, so every method assigns credit per turn. The
  outcome reward is the final answer's, the step labels are the per-turn
  oracle labels (`task.score` of the turns' texts).

  Returns:
    what `rollout` returns; the info's `verifier` dict also holds the
    episodes' statistics (`rollout/*`), which the loop logs.
  """
  cfg = ctx.config.rl
  task = ctx.task
  prompt_rows, rows = rollout_rows(ctx)
  problems = rollout_problems(ctx, step, prompt_rows)
  episodes = task.sample_episodes(
      ctx.model_config, params, problems, ctx.rng("rollout", step),
      temperature=cfg.temperature, top_p=cfg.top_p,
      num_samples=cfg.group_size)
  total = cfg.prompts_per_step * cfg.group_size
  put = lambda x: mesh_lib.put_local_batch(x, ctx.mesh, total)
  out = sampler.SampleOutput(
      tokens=put(episodes.tokens),
      attention_mask=put(episodes.attention_mask),
      response_mask=put(episodes.response_mask),
      logprobs=put(episodes.logprobs), step_ids=put(episodes.turn_ids),
      lengths=put(episodes.lengths), truncated=put(episodes.truncated),
      stopped=put(episodes.done))
  t1 = time.time()
  repeated = [p for p in problems for _ in range(cfg.group_size)]
  scored = task.score(repeated, episodes.actions, ~episodes.truncated)
  reward_s = time.time() - t1
  policy_tokens = episodes.response_mask.sum(axis=1)
  observation_tokens = episodes.observation_mask.sum(axis=1)
  sums = mesh_lib.process_sums({
      "tokens": episodes.lengths.sum(), "rows": len(repeated),
      "turns": episodes.num_turns.sum(), "policy": policy_tokens.sum(),
      "observation": observation_tokens.sum(), "done": episodes.done.sum(),
      "truncated": episodes.truncated.sum(),
      "env_errors": (episodes.env_stats.errors + episodes.env_stats.timeouts +
                     episodes.env_stats.crashes),
      "observations_cut": episodes.observations_cut})
  n = max(sums["rows"], 1)
  stats = {"rollout/turns_mean": sums["turns"] / n,
           "rollout/policy_tokens_mean": sums["policy"] / n,
           "rollout/observation_tokens_mean": sums["observation"] / n,
           "rollout/episodes_done": sums["done"] / n,
           "rollout/episodes_truncated": sums["truncated"] / n,
           "rollout/env_errors": sums["env_errors"],
           "rollout/observations_cut": sums["observations_cut"]}
  info = {"lengths": episodes.lengths, "rows": rows,
          "num_tokens": int(sums["tokens"]), "reward_s": reward_s,
          "verifier": stats}
  return out, scored, info


def accuracy_filter(rewards, group_size: int, low: float, high: float):
  """[B] 0/1 row weights keeping groups whose mean reward is in [low, high]."""
  means = rewards.reshape(-1, group_size).mean(axis=1)
  keep = (means >= low) & (means <= high)
  return np.repeat(keep, group_size).astype(np.float32)


def recompute_old_logprobs(config) -> bool:
  """Whether π_old is recomputed with the update's forward pass.

  `rl.old_logprobs`: "sampler" keeps the sampler's log-probs, "recompute"
  always recomputes, "auto" recomputes exactly where the two can differ:
  activations or the sampler's weight copy not float32 (bfloat16 moves a
  log-prob by up to ~0.03), or a temperature ≠ 1 / top-p < 1 (the sampler
  reports the untempered log-prob; the update and the recomputation use
  logits / T, the distribution that was sampled). In float32 at T = 1 the
  sampler's log-probs equal the forward pass's (tests/runners/rl_test.py).
  """
  cfg = config.rl
  if cfg.old_logprobs != "auto":
    return cfg.old_logprobs == "recompute"
  return (config.model.dtype != "float32" or
          cfg.sampler_dtype not in ("", "float32") or
          cfg.temperature not in (0.0, 1.0) or cfg.top_p < 1.0)


def run(ctx, params, ref_params=None, verifier=None):
  """Runs (or resumes, or reuses) the RL stage from policy `params`.

  Args:
    ctx: the run context.
    params: the initial policy (the SFT result).
    ref_params: the reference policy for the KL penalty and PRIME's implicit
      PRM (default `params`).
    verifier: a `methods.base.Verifier` (trained verifier and what it was
      trained on) for methods that read step scores with
      `prm_source="model"`.

  Returns:
    (final policy params, stage summary dict).
  """
  cfg = ctx.config.rl
  num_steps = ctx.config.task.max_steps
  rollout_batch = cfg.prompts_per_step * cfg.group_size
  mesh_lib.check_batch_divides(rollout_batch // cfg.minibatches, ctx.mesh,
                               "config.rl (rollout minibatch)")
  mesh_lib.check_batch_divides(cfg.prompts_per_step, ctx.mesh,
                               "config.rl.prompts_per_step")
  pass_rows = config_lib.pass_micro_batch_size(cfg)
  for key, rows in (("micro_batch_size", cfg.micro_batch_size),
                    ("pass_micro_batch_size", pass_rows)):
    if rows:  # Micro-batches keep rows on every device (train.microbatch).
      mesh_lib.check_batch_divides(rows, ctx.mesh, f"config.rl.{key}")
  method = methods_lib.make(ctx.config, verifier)
  if method.reads_step_scores and cfg.prm_source == "model" and (
      method.verifier is None):
    raise config_lib.ConfigError(
        f"config.rl.method={cfg.method!r} with prm_source='model' needs a "
        "trained verifier: add the 'labels' and 'prm' stages, or set "
        "config.prm.init_from, or use config.rl.prm_source='oracle'.")
  verifier = method.verifier
  method.check()
  ref_params = params if ref_params is None else ref_params
  needs_reference = method.reads_reference or cfg.kl_coef > 0
  # The step checker's labels: the oracle's step scores, and the
  # diagnostics against the truth.
  reads_oracle = ctx.task.has_step_labels and (
      (method.reads_step_scores and verifier is None) or
      cfg.log_oracle_agreement)

  # ---------------------------------------------------------------- state ---
  # Every trained model with its optimizer state: the policy, the models
  # the method's updates train, the refreshed verifier.
  policy_update = programs.policy_update(ctx.config, ctx.model_config)
  declared = method.programs(ctx.model_config)
  updates = [p for p in declared if isinstance(p, programs.Update)]
  initial = method.init_models(ctx, params)
  state, shardings = {}, {}
  state["policy"], shardings["policy"] = context_lib.create_state(
      ctx.model_config, ctx.mesh, params, policy_update.tx)
  for update in updates:
    state[update.model], shardings[update.model] = context_lib.create_state(
        ctx.model_config, ctx.mesh, initial[update.model], update.tx,
        heads=update.heads)
  refresh = None
  if verifier_refresh.enabled(ctx.config):
    verifier_refresh.check(ctx.config, verifier)
    refresh_tx = programs.rl_optimizer(cfg, cfg.verifier_refresh_lr)
    state["verifier"], shardings["verifier"] = context_lib.create_state(
        ctx.model_config, ctx.mesh, verifier.scorer.params[0], refresh_tx,
        heads=verifier_refresh.HEADS[verifier.model])

  ckpt = ctx.checkpointer(STAGE)
  meta = {"seconds": 0.0, "initial_eval": None, "last_eval": None,
          "skip_runs": {}}
  # RL steps done: checkpoints are saved at RL steps (the policy's own
  # counter counts its updates, epochs × minibatches of them a step).
  step = 0
  if ckpt.latest_step() is not None:
    step = int(ckpt.latest_step())
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    if done is not None and done["step"] == step and step >= cfg.steps:
      print(f"[rl] reusing the finished stage (step {step})")
      ckpt.close()
      return state["policy"].params, done["summary"]
    ctx.writer.drop_after(ctx.stage_order, STAGE, step)
    print(f"[rl] resuming from step {step}")

  # ------------------------------------------------------------ programs ---
  batch_sharding = mesh_lib.batch_sharding(ctx.mesh)

  def put_rows(local):
    """This process's rollout rows (host) -> a global [B, ...] array."""
    return mesh_lib.put_local_batch(local, ctx.mesh, rollout_batch)

  # Updates accumulate gradients over micro-batches of `micro_batch_size`
  # rows; the passes over the rollout (reference and π_old log-probs, the
  # method's own) run `pass_micro_batch_size` rows at a time.
  policy_step = policy_update.jit(shardings["policy"], ctx.mesh)
  # The method's programs by name, for its `signals` and `update`.
  fns = {p.name: p.jit(shardings[p.model], ctx.mesh)
         if isinstance(p, programs.Update) else p.fn for p in declared}
  if "verifier" in state:
    refresh = verifier_refresh.make(ctx, verifier, refresh_tx,
                                    shardings["verifier"])
  reference_fn = programs.logprob_pass(ctx.config, ctx.model_config)
  old_logprob_fn = (programs.logprob_pass(
      ctx.config, ctx.model_config,
      temperature=programs.update_temperature(cfg))
                    if recompute_old_logprobs(ctx.config) else None)
  sampler_weights = programs.sampler_weights(ctx.config, ctx.model_config,
                                             ctx.mesh)
  advantage_fn = jax.jit(method.advantages)
  diagnostics_fn = jax.jit(rl_metrics.advantage_diagnostics)
  clamp = jax.jit(lambda ids: method_base.clamp_step_ids(ids, num_steps))
  # Multi-turn tasks roll out episodes; the phases after it are the same.
  sample_rollout = (rollout_episodes if getattr(ctx.task, "multi_turn", False)
                    else rollout)
  step_ends = jax.jit(core.step_end_mask_from_ids)

  if meta["initial_eval"] is None:
    meta["initial_eval"] = evaluation.evaluate(
        ctx, state["policy"].params, rng=ctx.rng("eval", 0), with_pass_n=False)
    ctx.writer.write(STAGE, 0, meta["initial_eval"])
  seconds = float(meta["seconds"])
  # The latest held-out evaluation: a run resumed from its final checkpoint
  # summarises it instead of evaluating again.
  last_eval = dict(meta.get("last_eval") or meta["initial_eval"])
  # Consecutive skipped updates per trained model: each policy update, and
  # for the method's models each RL step with a skipped update.
  guards = {name: nonfinite.SkipGuard(
      f"{STAGE}/{name}", ctx.config.train.max_consecutive_skips,
      run=int((meta.get("skip_runs") or {}).get(name, 0)),
      what="policy update" if name == "policy" else "step")
            for name in state}
  skipped_before = {name: int(model.skipped) for name, model in state.items()}
  update_keys = ("tokens", "attention_mask", "response_mask", "old_logprobs",
                 "advantages") + (("ref_logprobs",) if cfg.kl_coef > 0
                                  else ()) + tuple(method.update_keys)

  # ----------------------------------------------------------------- loop ---
  while step < cfg.steps and not (cfg.max_seconds and
                                  seconds >= cfg.max_seconds):
    # Rollout.
    t0 = time.time()
    out, scored, info = sample_rollout(
        ctx, sampler_weights(state["policy"].params), step)
    t1 = time.time()
    record = {}
    weights = np.ones((len(scored.rewards),), np.float32)
    if cfg.filter_accuracy:
      weights = accuracy_filter(scored.rewards, cfg.group_size,
                                cfg.filter_accuracy_low,
                                cfg.filter_accuracy_high)
      kept = mesh_lib.process_sums({"kept": weights.sum(),
                                    "rows": weights.size})
      record["train/kept_fraction"] = kept["kept"] / kept["rows"]
    batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
             "response_mask": out.response_mask * put_rows(weights)[:, None],
             "step_ids": clamp(out.step_ids),
             "step_end_mask": step_ends(out.step_ids),
             "old_logprobs": out.logprobs,
             "rewards": put_rows(scored.rewards)}
    if method.reads_answers:  # The true answer of each row's problem.
      answers, answer_mask = ctx.task.answer_tokens(
          rollout_problems(ctx, step, rollout_rows(ctx)[0]))
      batch["answer_tokens"] = put_rows(
          np.repeat(answers, cfg.group_size, axis=0))
      batch["answer_mask"] = put_rows(
          np.repeat(answer_mask, cfg.group_size, axis=0))

    # Signals.
    if needs_reference:
      batch["ref_logprobs"] = reference_fn(ref_params, out.tokens,
                                           out.attention_mask)
    if old_logprob_fn is not None:
      batch["old_logprobs"] = old_logprob_fn(state["policy"].params,
                                             out.tokens, out.attention_mask)
    oracle = (step_scores.oracle_step_arrays(scored.step_labels, num_steps)
              if reads_oracle else None)
    if method.reads_step_scores:
      batch.update(step_scores.step_score_arrays(
          verifier, batch, oracle, put_rows,
          (state["verifier"].params,) if refresh is not None else None))
      if verifier is not None and oracle is not None:
        record.update(rl_metrics.verifier_agreement(
            ctx.mesh, batch, oracle["labels"], scored.rewards))
    state, extra, method_record = method.signals(ctx, fns, state, batch)
    batch.update(extra)
    record.update(method_record)
    # The signals are dispatched asynchronously: wait for them, so that
    # time/prm_s is their time and not part of the update's.
    jax.block_until_ready(batch)
    t2 = time.time()

    # Advantages.
    batch["advantages"], parts = advantage_fn(batch)
    record.update(context_lib.host_scalars(diagnostics_fn(
        batch["advantages"], parts, batch["response_mask"])))
    if "process" in parts and oracle is not None and cfg.log_oracle_agreement:
      record.update(rl_metrics.process_signal(
          ctx.mesh, parts["process"], batch["step_ids"], weights,
          oracle["labels"], num_steps))
    t3 = time.time()

    # Updates.
    size = rollout_batch // cfg.minibatches
    update_records = []
    for _ in range(cfg.epochs):
      for m in range(cfg.minibatches):
        rows = slice(m * size, (m + 1) * size)
        minibatch = jax.device_put({k: batch[k][rows] for k in update_keys},
                                   batch_sharding)
        state["policy"], metrics = policy_step(state["policy"], minibatch)
        guards["policy"].observe(step + 1, metrics["skipped"])
        state, extra_metrics = method.update(fns, state, minibatch)
        update_records.append(context_lib.host_scalars(
            {**metrics, **extra_metrics}))
    record.update({f"train/{k}": v for k, v in
                   rl_metrics.mean_update_metrics(update_records).items()})
    if refresh is not None:
      state["verifier"], refresh_metrics = refresh(state["verifier"], batch)
      record.update({f"train/verifier_refresh/{k}": v for k, v in
                     context_lib.host_scalars(refresh_metrics).items()})
    t4 = time.time()

    # Log.
    step += 1
    seconds += t4 - t0
    record.update(rl_metrics.rollout_metrics(
        scored, info["lengths"], cfg.group_size, ctx.task.has_step_labels))
    record.update(info["verifier"])
    record["train/skipped_updates"] = int(state["policy"].skipped)
    for name, model in state.items():
      if name != "policy":
        skipped = int(model.skipped)
        guards[name].observe(step, skipped > skipped_before[name])
        skipped_before[name] = skipped
        record[f"train/{name}_skipped_updates"] = skipped
    record.update({
        "time/rollout_s": t1 - t0 - info["reward_s"],
        "time/reward_s": info["reward_s"], "time/prm_s": t2 - t1,
        "time/advantage_s": t3 - t2, "time/update_s": t4 - t3,
        "time/step_s": t4 - t0,
        "perf/tokens_per_sec": info["num_tokens"] / max(t4 - t0, 1e-9),
        "perf/rollout_tokens_per_sec": (
            info["num_tokens"] / max(t1 - t0 - info["reward_s"], 1e-9)),
        "samples": step * rollout_batch,
    })
    if step % cfg.eval_every_steps == 0 or step == cfg.steps:
      te = time.time()
      last_eval = evaluation.evaluate(ctx, state["policy"].params,
                                      rng=ctx.rng("eval", 0),
                                      with_pass_n=step == cfg.steps)
      record.update(last_eval)
      record["time/eval_s"] = time.time() - te
    ctx.writer.write(STAGE, step, record)
    if step % cfg.log_every_steps == 0:
      metrics_lib.print_status(metrics_lib.format_status(
          STAGE, step, cfg.steps, {**record, **last_eval},
          ("train/reward_mean", "eval/accuracy", "perf/tokens_per_sec",
           "time/step_s")))
    if step % cfg.checkpoint_every_steps == 0 or step == cfg.steps:
      meta.update(seconds=seconds, last_eval=last_eval,
                  skip_runs={n: g.flush() for n, g in guards.items()})
      ckpt.save(step, state, meta)
  for guard in guards.values():
    guard.flush()

  pass_key = f"eval/pass@{ctx.config.eval.pass_n}"
  if ctx.config.eval.pass_n > 1 and pass_key not in last_eval:
    last_eval = evaluation.evaluate(ctx, state["policy"].params,
                                    rng=ctx.rng("eval", 0))
    ctx.writer.write(STAGE, step, last_eval)
  summary = dict(last_eval)
  summary.update({"rl/steps": step, "rl/seconds": seconds,
                  "rl/samples": step * rollout_batch,
                  "rl/skipped_updates": int(state["policy"].skipped)})
  summary.update({f"rl/{name}_skipped_updates": int(model.skipped)
                  for name, model in state.items() if name != "policy"})
  ckpt.mark_done(step, summary)
  ckpt.close()
  return state["policy"].params, summary
