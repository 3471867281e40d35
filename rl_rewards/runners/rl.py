"""The RL stage: rollout → signals → advantages → updates → log.

One RL step:
  1. rollout: `prompts_per_step` fresh train problems, `group_size` samples
     each (the n samples of a prompt are contiguous rows); decode, score
     with the task's verifier (outcome reward) and its step checker
     (ground-truth step labels: the oracle, and the diagnostics); the
     accuracy filter's row weights multiply the response mask from here on;
  2. signals: π_old (`rl.old_logprobs`), the reference log-probs, the
     verifier's (or the oracle's) step scores, then the method's own signal
     (`methods.METHODS[config.rl.method]`, e.g. PRIME's implicit PRM, which
     learns here, or PPO's values);
  3. advantages: the method's pure advantage function, jitted once;
  4. updates: `epochs` passes of `minibatches` PPO-clip policy steps, each
     followed by the method's extra update (PPO's critic);
  5. log: rollout statistics, the averaged update metrics of every
     minibatch, and where the signal is (`advantage_diagnostics`).

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
import jax.numpy as jnp
import numpy as np

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards import metrics as metrics_lib
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import evaluation
from rl_rewards.runners import methods as methods_lib
from rl_rewards.runners import programs
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
          "verifier": verifier_metrics(task)}
  return out, scored, info


def verifier_metrics(task) -> dict:
  """The outcome verifier's call counts of the last scoring (text tasks):
  `verifier/calls`, `timeouts`, `crashes`, `oversize`, `wrong_type`, ...
  summed over processes, and this process's slowest call `max_call_s`."""
  stats = getattr(task, "last_verifier_stats", None)
  if stats is None:
    return {}
  counts = stats.as_dict()
  slowest = counts.pop("max_call_s")
  out = {f"verifier/{k}": v for k, v in mesh_lib.process_sums(counts).items()}
  out["verifier/max_call_s"] = slowest
  return out


def accuracy_filter(rewards, group_size: int, low: float, high: float):
  """[B] 0/1 row weights keeping groups whose mean reward is in [low, high]."""
  means = rewards.reshape(-1, group_size).mean(axis=1)
  keep = (means >= low) & (means <= high)
  return np.repeat(keep, group_size).astype(np.float32)


def rollout_metrics(scored, lengths, group_size: int,
                    has_step_labels: bool = True) -> dict:
  """Reward and behaviour statistics of a scored rollout batch.

  Besides reward, these expose reward hacking: steps per response, tokens per
  step, the fraction of empty steps, and answers that are right despite a
  wrong step. Each process passes its own rows (whole groups); means are
  sums over all processes' rows divided by counts (`mesh.process_sums`),
  e.g. reward_mean = Σ_i r_i / B.
  """
  rewards = np.asarray(scored.rewards, np.float64)
  lengths = np.asarray(lengths, np.float64)
  groups = rewards.reshape(-1, group_size)
  all_steps = np.array([len(l) > 0 and all(l) for l in scored.step_labels],
                       bool)
  steps_per = np.maximum(scored.num_steps, 1)
  total = mesh_lib.process_sums({
      "rows": rewards.size, "groups": groups.shape[0],
      "reward": rewards.sum(),
      "mixed": np.sum(groups.max(axis=1) != groups.min(axis=1)),
      "all_wrong": np.sum(groups.max(axis=1) <= 0),
      "all_right": np.sum(groups.min(axis=1) > 0),
      "length": lengths.sum(), "steps": np.sum(scored.num_steps),
      "tokens_per_step": np.sum(lengths / steps_per),
      "empty": np.sum(scored.empty_steps), "all_steps": all_steps.sum(),
      "right_with_wrong_step": np.sum((rewards > 0) & ~all_steps)})
  rows = max(total["rows"], 1)
  out = {
      "train/reward_mean": total["reward"] / rows,
      "train/mixed_groups": total["mixed"] / max(total["groups"], 1),
      # Groups whose samples all got the same outcome: no outcome signal.
      "train/zero_outcome_signal_groups": (
          1.0 - total["mixed"] / max(total["groups"], 1)),
      "train/all_wrong_groups": total["all_wrong"] / max(total["groups"], 1),
      "train/all_right_groups": total["all_right"] / max(total["groups"], 1),
      "train/response_length": total["length"] / rows,
      "train/steps_per_response": total["steps"] / rows,
      "train/tokens_per_step": total["tokens_per_step"] / rows,
      "train/empty_step_fraction": total["empty"] / max(total["steps"], 1),
  }
  if has_step_labels:
    out["train/all_steps_correct"] = total["all_steps"] / rows
    out["train/correct_with_wrong_step"] = (total["right_with_wrong_step"] /
                                            rows)
  return out


def prm_agreement_metrics(step_scores, step_ids, oracle_labels, rewards):
  """How a verifier's step scores agree with the outcome and the step checker.

  `prm/verifier_agreement`: the response-level verdict "min step score ≥ ½"
  equals the outcome reward; `prm/step_label_agreement`: per-step verdicts
  equal the ground-truth labels; `prm/first_error_agreement`: the first step
  scored below ½ is the first wrong step (both "none" counts as agreeing);
  `prm/min_step_position`: where in the response (0 = first step, 1 = last)
  the lowest score sits. Host arrays of this process's rows ([R, S] scores,
  [R, T] step ids, [R, S] labels, [R] rewards); the means are over all
  processes' rows (`mesh.process_sums`).
  """
  ids = np.asarray(step_ids)
  num_steps = np.maximum(ids.max(axis=1) + 1, 1)
  scores = np.asarray(step_scores, np.float64)
  labels = np.asarray(oracle_labels) >= 0.5
  valid = np.arange(scores.shape[1])[None, :] < num_steps[:, None]
  masked = np.where(valid, scores, np.inf)
  min_score = masked.min(axis=1)
  argmin = masked.argmin(axis=1)
  predicted_ok = min_score >= 0.5
  step_agree = ((scores >= 0.5) == labels)[valid]
  total = mesh_lib.process_sums({
      "rows": ids.shape[0], "steps": step_agree.size,
      "verifier": np.sum(predicted_ok == (np.asarray(rewards) > 0)),
      "step_label": step_agree.sum(),
      "first_error": np.sum(_first_false(masked >= 0.5, valid) ==
                            _first_false(labels, valid)),
      "position": np.sum(argmin / np.maximum(num_steps - 1, 1)),
      "last": np.sum(argmin == num_steps - 1),
      "score": scores[valid].sum()})
  rows, steps = max(total["rows"], 1), max(total["steps"], 1)
  return {
      "prm/verifier_agreement": total["verifier"] / rows,
      "prm/step_label_agreement": total["step_label"] / steps,
      "prm/first_error_agreement": total["first_error"] / rows,
      "prm/min_step_position": total["position"] / rows,
      "prm/min_at_last_step": total["last"] / rows,
      "prm/mean_step_score": total["score"] / steps,
  }


def _first_false(ok, valid):
  """[R] index of the first valid False of `ok` [R, S], −1 when none."""
  bad = valid & ~ok
  return np.where(bad.any(axis=1), bad.argmax(axis=1), -1)


def process_signal_metrics(step_process, row_kept, oracle_labels,
                           num_steps):
  """Where a method's process signal points, against the step checker.

  Args:
    step_process: [R, S] the process part of the advantage averaged over
      each step's tokens (`parts["process"]`, `tokens_to_steps(mean)`).
    row_kept: [R] bool, rows that take part in the update (not filtered).
    oracle_labels: [R, S] ground-truth step labels (1 correct, 0 wrong).
    num_steps: [R] steps of each response (slots 0 .. num_steps − 1).

  Returns (means over all processes' kept rows, `mesh.process_sums`):
    `train/process_signal_rows`: rows whose process part is non-zero on
      some step;
    `train/process_blames_first_error`: of the rows with a wrong step, those
      whose lowest process advantage (the earliest, on ties) is on the
      first wrong step;
    `train/process_negative_at_first_error`: of the same rows, those whose
      process advantage on the first wrong step is < 0;
    `train/process_negative_on_correct_rows`: of the rows with every step
      right, those with a negative process advantage on some step (credit
      taken from a correct solution).
  """
  values = np.asarray(step_process, np.float64)
  kept = np.asarray(row_kept, bool)
  steps = np.arange(values.shape[1])[None, :]
  valid = steps < np.asarray(num_steps)[:, None]
  labels = np.asarray(oracle_labels) >= 0.5
  first_error = _first_false(labels, valid)
  has_error = kept & (first_error >= 0)
  all_right = kept & (first_error < 0) & valid.any(axis=1)
  lowest = np.where(valid, values, np.inf).argmin(axis=1)
  at_error = values[np.arange(values.shape[0]), np.maximum(first_error, 0)]
  negative = (np.where(valid, values, 0.0) < -1e-8).any(axis=1)
  total = mesh_lib.process_sums({
      "kept": kept.sum(), "errors": has_error.sum(),
      "right": all_right.sum(),
      "signal": np.sum(kept & (np.abs(np.where(valid, values, 0.0)) >
                               1e-8).any(axis=1)),
      "blamed": np.sum(has_error & (lowest == first_error)),
      "negative": np.sum(has_error & (at_error < -1e-8)),
      "negative_right": np.sum(all_right & negative)})
  return {
      "train/process_signal_rows": total["signal"] / max(total["kept"], 1),
      "train/process_blames_first_error": (total["blamed"] /
                                           max(total["errors"], 1)),
      "train/process_negative_at_first_error": (total["negative"] /
                                                max(total["errors"], 1)),
      "train/process_negative_on_correct_rows": (total["negative_right"] /
                                                 max(total["right"], 1)),
  }


def advantage_diagnostics(advantages, parts: dict, response_mask) -> dict:
  """Where the learning signal is: jittable, over the valid tokens.

  `train/nonzero_advantage_fraction`: tokens with |A| > 1e-8;
  `train/advantage_var`: Var(A); `train/advantage_var_<part>`: the variance
  of each part of the method's split (`outcome`, `process`).
  """
  mask = response_mask > 0
  count = jnp.maximum(jnp.sum(mask), 1)
  out = {"train/nonzero_advantage_fraction":
             jnp.sum(mask & (jnp.abs(advantages) > 1e-8)) / count,
         "train/advantage_var": core.masked_var(advantages, mask,
                                                unbiased=False)}
  for name, part in parts.items():
    out[f"train/advantage_var_{name}"] = core.masked_var(part, mask,
                                                         unbiased=False)
  return out


def mean_update_metrics(records: list) -> dict:
  """Update metrics of every minibatch: the mean of each, `skipped` summed."""
  keys = records[0].keys()
  return {k: (float(np.sum([r[k] for r in records])) if k.endswith("skipped")
              else float(np.mean([r[k] for r in records]))) for k in keys}


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


def step_score_arrays(ctx, verifier, batch, oracle, put_rows,
                      verifier_params=None):
  """The verifier's (or oracle's) step signal of a rollout batch.

  Returns `step_scores` [B, S] (P(step correct)), `q_values` [B, S] (Q^π of
  each prefix) and `v_init` [B] (V^π of the question) as device arrays. A
  learned verifier's scores are its Q^π (with `verifier_params`, the
  refreshed verifier's parameters instead of its trained ones); the oracle
  gives 0/1 step labels, a perfect prover's Q (1 until the first wrong
  step) and V = 1.
  """
  if verifier is None:
    return {"step_scores": put_rows(oracle["labels"]),
            "q_values": put_rows(oracle["q_values"]),
            "v_init": put_rows(oracle["v_init"])}
  scores = verifier.scorer.score_rollout(batch["tokens"],
                                         batch["attention_mask"],
                                         batch["step_ids"],
                                         params=verifier_params)
  return {"step_scores": scores["step_scores"],
          "q_values": scores["step_scores"], "v_init": scores["v_init"]}


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
  method = methods_lib.make(ctx.config)
  from_verifier = method.reads_step_scores and cfg.prm_source == "model"
  if from_verifier and verifier is None:
    raise config_lib.ConfigError(
        f"config.rl.method={cfg.method!r} with prm_source='model' needs a "
        "trained verifier: add the 'labels' and 'prm' stages, or set "
        "config.prm.init_from, or use config.rl.prm_source='oracle'.")
  verifier = verifier if from_verifier else None
  method.check(verifier)
  ref_params = params if ref_params is None else ref_params
  needs_reference = method.reads_reference or cfg.kl_coef > 0

  # ---------------------------------------------------------------- state ---
  tx = programs.rl_optimizer(cfg, cfg.learning_rate)
  state, shardings = {}, {}
  state["policy"], shardings["policy"] = context_lib.create_state(
      ctx.model_config, ctx.mesh, params, tx)
  for name, extra in method.models(ctx, params).items():
    state[name], shardings[name] = context_lib.create_state(
        ctx.model_config, ctx.mesh, extra.params, extra.tx, heads=extra.heads)
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
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    step = int(state["policy"].step)
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
  policy_step = programs.jit_update(
      programs.policy_step_fn(ctx.config, ctx.model_config, tx),
      shardings["policy"], ctx.mesh)
  method.build(ctx, shardings)
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
  diagnostics_fn = jax.jit(advantage_diagnostics)
  clamp = jax.jit(lambda ids: method_base.clamp_step_ids(ids, num_steps))
  step_means = jax.jit(lambda x, ids: core.tokens_to_steps(
      x, ids, num_steps, reduce="mean"))
  step_ends = jax.jit(core.step_end_mask_from_ids)

  step = int(state["policy"].step)
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
    out, scored, info = rollout(ctx, sampler_weights(state["policy"].params),
                                step)
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

    # Signals.
    if needs_reference:
      batch["ref_logprobs"] = reference_fn(ref_params, out.tokens,
                                           out.attention_mask)
    if old_logprob_fn is not None:
      batch["old_logprobs"] = old_logprob_fn(state["policy"].params,
                                             out.tokens, out.attention_mask)
    oracle = None
    if ctx.task.has_step_labels and (
        (method.reads_step_scores and verifier is None) or
        cfg.log_oracle_agreement):
      oracle = method_base.oracle_step_arrays(scored.step_labels, num_steps)
    if method.reads_step_scores:
      batch.update(step_score_arrays(
          ctx, verifier, batch, oracle, put_rows,
          (state["verifier"].params,) if refresh is not None else None))
      if verifier is not None and oracle is not None:
        record.update(prm_agreement_metrics(
            *mesh_lib.local_rows((batch["step_scores"], batch["step_ids"]),
                                 ctx.mesh),
            oracle["labels"], scored.rewards))
    state, extra, method_record = method.signals(ctx, state, batch)
    batch.update(extra)
    record.update(method_record)
    t2 = time.time()

    # Advantages.
    batch["advantages"], parts = advantage_fn(batch)
    record.update(context_lib.host_scalars(diagnostics_fn(
        batch["advantages"], parts, batch["response_mask"])))
    if "process" in parts and oracle is not None and cfg.log_oracle_agreement:
      local_process, local_ids = mesh_lib.local_rows(
          (step_means(parts["process"], batch["step_ids"]),
           batch["step_ids"]), ctx.mesh)
      record.update(process_signal_metrics(
          local_process, weights > 0, oracle["labels"],
          np.asarray(local_ids).max(axis=1) + 1))
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
        state, extra_metrics = method.update(state, minibatch)
        update_records.append(context_lib.host_scalars(
            {**metrics, **extra_metrics}))
    record.update({f"train/{k}": v for k, v in
                   mean_update_metrics(update_records).items()})
    if refresh is not None:
      state["verifier"], refresh_metrics = refresh(state["verifier"], batch)
      record.update({f"train/verifier_refresh/{k}": v for k, v in
                     context_lib.host_scalars(refresh_metrics).items()})
    t4 = time.time()

    # Log.
    step += 1
    seconds += t4 - t0
    record.update(rollout_metrics(scored, info["lengths"], cfg.group_size,
                                  ctx.task.has_step_labels))
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
