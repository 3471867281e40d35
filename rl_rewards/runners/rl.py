"""The RL stage: rollouts → rewards → credit assignment → PPO-clip updates.

One RL step:
  1. rollout: `prompts_per_step` fresh train problems, `group_size` samples
     each (the n samples of a prompt are contiguous rows);
  2. reward: decode, score with the task's verifier (outcome reward) and its
     step checker (ground-truth step labels: logged, and used by the oracle);
  3. process signal, per method: PRM step scores (learned PRM/PAV or the
     oracle), the online implicit PRM (PRIME, updated here on outcome labels)
     or the value model (PPO);
  4. credit assignment: `credit.ADVANTAGE_FNS[config.rl.method]`;
  5. update: `epochs` passes of `minibatches` PPO-clip steps (and the value
     model's regression for PPO).

Everything random is keyed by (seed, step) and the prompts of step s are a
pure function of s, so a resumed run reproduces an uninterrupted one exactly.
With several processes, each one builds, decodes and scores only its own rows
of the rollout (whole groups: `mesh.process_rows`); rewards and step labels
go back on the mesh as global arrays, and rollout metrics are combined from
per-process sums, so every process logs the numbers of a single-process run.
The checkpointed state holds every trained model (`policy`, and `value` or
`implicit_prm`) with its own optimizer state.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import credit
from rl_rewards.runners import evaluation
from rl_rewards.runners import programs
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.sharding import mesh as mesh_lib

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
      top_p=cfg.top_p, eos_id=task.tokenizer.eos_id,
      pad_id=task.tokenizer.pad_id, delimiter_mask=task.delimiter_mask(),
      num_samples=cfg.group_size)
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
          "num_tokens": int(num_tokens["tokens"]), "reward_s": reward_s}
  return out, scored, info


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
      "length": lengths.sum(), "steps": np.sum(scored.num_steps),
      "tokens_per_step": np.sum(lengths / steps_per),
      "empty": np.sum(scored.empty_steps), "all_steps": all_steps.sum(),
      "right_with_wrong_step": np.sum((rewards > 0) & ~all_steps)})
  rows = max(total["rows"], 1)
  out = {
      "train/reward_mean": total["reward"] / rows,
      "train/mixed_groups": total["mixed"] / max(total["groups"], 1),
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
  """How a PRM's step scores agree with the verifier and the step checker.

  `prm/verifier_agreement`: the response-level verdict "min step score ≥ ½"
  equals the outcome reward; `prm/step_label_agreement`: per-step verdicts
  equal the ground-truth labels; `prm/min_step_position`: where in the
  response (0 = first step, 1 = last) the lowest score sits. Host arrays of
  this process's rows ([R, S] scores, [R, T] step ids, [R, S] labels, [R]
  rewards); the means are over all processes' rows (`mesh.process_sums`).
  """
  ids = np.asarray(step_ids)
  num_steps = np.maximum(ids.max(axis=1) + 1, 1)
  scores = np.asarray(step_scores, np.float64)
  valid = np.arange(scores.shape[1])[None, :] < num_steps[:, None]
  masked = np.where(valid, scores, np.inf)
  min_score = masked.min(axis=1)
  argmin = masked.argmin(axis=1)
  predicted_ok = min_score >= 0.5
  step_agree = ((scores >= 0.5) == (np.asarray(oracle_labels) >= 0.5))[valid]
  total = mesh_lib.process_sums({
      "rows": ids.shape[0], "steps": step_agree.size,
      "verifier": np.sum(predicted_ok == (np.asarray(rewards) > 0)),
      "step_label": step_agree.sum(),
      "position": np.sum(argmin / np.maximum(num_steps - 1, 1)),
      "last": np.sum(argmin == num_steps - 1),
      "score": scores[valid].sum()})
  rows, steps = max(total["rows"], 1), max(total["steps"], 1)
  return {
      "prm/verifier_agreement": total["verifier"] / rows,
      "prm/step_label_agreement": total["step_label"] / steps,
      "prm/min_step_position": total["position"] / rows,
      "prm/min_at_last_step": total["last"] / rows,
      "prm/mean_step_score": total["score"] / steps,
  }


def run(ctx, params, ref_params=None, prm=None):
  """Runs (or resumes, or reuses) the RL stage from policy `params`.

  Args:
    ctx: the run context.
    params: the initial policy (the SFT result).
    ref_params: the reference policy for the KL penalty and PRIME's implicit
      PRM (default `params`).
    prm: for process-reward methods with `prm_source="model"`, a
      `prm.scoring.Scorer`-like object with `score_rollout(tokens,
      attention_mask, step_ids) -> dict(step_scores [B, S], v_init [B])`.

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
  method = cfg.method
  uses_prm = method in credit.PRM_METHODS
  if uses_prm and cfg.prm_source == "model" and prm is None:
    raise ValueError(
        f"config.rl.method={method!r} with prm_source='model' needs a trained "
        "PRM: add the 'labels' and 'prm' stages, or set config.prm.init_from, "
        "or use config.rl.prm_source='oracle'.")
  ref_params = params if ref_params is None else ref_params

  # ---------------------------------------------------------------- state ---
  tx = programs.rl_optimizer(cfg, cfg.learning_rate)
  policy, policy_sh = context_lib.create_state(ctx.model_config, ctx.mesh,
                                               params, tx)
  state, shardings = {"policy": policy}, {"policy": policy_sh}
  if method == "ppo":
    value_tx = programs.rl_optimizer(cfg, cfg.value_learning_rate)
    value_params = models.init_from_backbone(
        ctx.model_config, jax.device_get(params), ctx.rng("value_init"),
        heads=("score",))
    state["value"], shardings["value"] = context_lib.create_state(
        ctx.model_config, ctx.mesh, value_params, value_tx, heads=("score",))
  if method == "prime":
    prm_tx = programs.rl_optimizer(cfg, cfg.prime_learning_rate)
    state["implicit_prm"], shardings["implicit_prm"] = (
        context_lib.create_state(ctx.model_config, ctx.mesh, params, prm_tx))

  ckpt = ctx.checkpointer(STAGE)
  meta = {"seconds": 0.0, "initial_eval": None}
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

  # ------------------------------------------------------------ functions ---
  batch_sharding = mesh_lib.batch_sharding(ctx.mesh)

  def put_rows(local):
    """This process's rollout rows (host) -> a global [B, ...] array."""
    return mesh_lib.put_local_batch(local, ctx.mesh, rollout_batch)

  def jit_update(fn, name):
    return programs.jit_update(fn, shardings[name], ctx.mesh)

  # Updates accumulate gradients over micro-batches of `micro_batch_size`
  # rows; the passes over the rollout (reference and implicit-PRM log-probs,
  # values) run `pass_micro_batch_size` rows at a time inside one jitted
  # function.
  policy_step = jit_update(
      programs.policy_step_fn(ctx.config, ctx.model_config, tx), "policy")
  if method == "ppo":
    value_step = jit_update(
        programs.value_step_fn(ctx.config, ctx.model_config, value_tx),
        "value")
    values_fn = programs.values_pass(ctx.config, ctx.model_config)
  if method == "prime":
    prm_step = jit_update(
        programs.implicit_prm_step_fn(ctx.config, ctx.model_config, prm_tx),
        "implicit_prm")
  logprob_fn = programs.logprob_pass(ctx.config, ctx.model_config)
  sampler_weights = programs.sampler_weights(ctx.config, ctx.model_config,
                                             ctx.mesh)
  advantage_fn = credit.make_advantage_fn(cfg)
  returns_fn = jax.jit(lambda b: credit.ppo_returns(cfg, b))
  clamp = jax.jit(lambda ids: credit.clamp_step_ids(ids, num_steps))

  step = int(state["policy"].step)
  if meta["initial_eval"] is None:
    meta["initial_eval"] = evaluation.evaluate(
        ctx, state["policy"].params, rng=ctx.rng("eval", 0), with_pass_n=False)
    ctx.writer.write(STAGE, 0, meta["initial_eval"])
  seconds = float(meta["seconds"])
  last_eval = dict(meta["initial_eval"])

  # ----------------------------------------------------------------- loop ---
  while step < cfg.steps and not (cfg.max_seconds and
                                  seconds >= cfg.max_seconds):
    t0 = time.time()
    out, scored, info = rollout(ctx, sampler_weights(state["policy"].params),
                                step)
    t1 = time.time()
    record = {}
    step_ids = clamp(out.step_ids)
    batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
             "response_mask": out.response_mask, "step_ids": step_ids,
             "old_logprobs": out.logprobs,
             "rewards": put_rows(scored.rewards)}
    weights = np.ones((len(scored.rewards),), np.float32)
    if cfg.filter_accuracy:
      weights = accuracy_filter(scored.rewards, cfg.group_size,
                                cfg.filter_accuracy_low,
                                cfg.filter_accuracy_high)
      kept = mesh_lib.process_sums({"kept": weights.sum(),
                                    "rows": weights.size})
      record["train/kept_fraction"] = kept["kept"] / kept["rows"]
    weights = put_rows(weights)

    # Process signal.
    if ctx.task.has_step_labels and (uses_prm or cfg.log_oracle_agreement):
      oracle = credit.oracle_step_arrays(scored.step_labels, num_steps)
    if uses_prm:
      if cfg.prm_source == "oracle":
        scores = {k: put_rows(oracle[k])
                  for k in ("q_steps", "v_init")}
        scores["step_scores"] = put_rows(oracle["labels"])
      else:
        scores = prm.score_rollout(out.tokens, out.attention_mask, step_ids)
        scores["q_steps"] = scores["step_scores"]
        if ctx.task.has_step_labels:
          record.update(prm_agreement_metrics(
              *mesh_lib.local_rows((scores["step_scores"], step_ids),
                                   ctx.mesh),
              oracle["labels"], scored.rewards))
      batch.update({k: jnp.asarray(v) for k, v in scores.items()})
    if method == "prime" or cfg.kl_coef > 0:
      batch["ref_logprobs"] = logprob_fn(ref_params, out.tokens,
                                         out.attention_mask)
    if method == "prime":
      implicit_logp = logprob_fn(state["implicit_prm"].params, out.tokens,
                                 out.attention_mask)
      batch["implicit_rewards"] = cfg.prime_beta * (
          implicit_logp - batch["ref_logprobs"]) * out.response_mask
      record["prm/implicit_reward_abs_mean"] = float(
          jnp.sum(jnp.abs(batch["implicit_rewards"])) /
          jnp.maximum(jnp.sum(out.response_mask), 1))
      prm_batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
                   "response_mask": out.response_mask * weights[:, None],
                   "ref_logprobs": batch["ref_logprobs"],
                   "labels": batch["rewards"]}
      state["implicit_prm"], prm_metrics = prm_step(
          state["implicit_prm"], jax.device_put(prm_batch, batch_sharding))
      record.update({f"train/{k}": v for k, v in
                     context_lib.host_scalars(prm_metrics).items()})
    if method == "ppo":
      batch["values"] = values_fn(state["value"].params, out.tokens,
                                  out.attention_mask)
    t2 = time.time()
    batch["advantages"] = advantage_fn(batch)
    batch["response_mask"] = batch["response_mask"] * weights[:, None]
    if method == "ppo":
      batch["old_values"] = batch["values"]
      batch["returns"] = returns_fn(batch)
    t3 = time.time()

    # Updates.
    size = rollout_batch // cfg.minibatches
    update_keys = ("tokens", "attention_mask", "response_mask",
                   "old_logprobs", "advantages") + (
                       ("ref_logprobs",) if cfg.kl_coef > 0 else ())
    for _ in range(cfg.epochs):
      for m in range(cfg.minibatches):
        rows = slice(m * size, (m + 1) * size)
        minibatch = jax.device_put(
            {k: batch[k][rows] for k in update_keys}, batch_sharding)
        state["policy"], update_metrics = policy_step(state["policy"],
                                                      minibatch)
        if method == "ppo":
          value_batch = jax.device_put(
              {k: batch[k][rows] for k in ("tokens", "attention_mask",
                                           "response_mask", "old_values",
                                           "returns")}, batch_sharding)
          state["value"], value_metrics = value_step(state["value"],
                                                     value_batch)
    record.update({f"train/{k}": v for k, v in
                   context_lib.host_scalars(update_metrics).items()})
    if method == "ppo":
      record.update({f"train/{k}": v for k, v in
                     context_lib.host_scalars(value_metrics).items()})
    t4 = time.time()
    step += 1
    seconds += t4 - t0
    record.update(rollout_metrics(scored, info["lengths"], cfg.group_size,
                                  ctx.task.has_step_labels))
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
      meta.update(seconds=seconds)
      ckpt.save(step, state, meta)

  pass_key = f"eval/pass@{ctx.config.eval.pass_n}"
  if ctx.config.eval.pass_n > 1 and pass_key not in last_eval:
    last_eval = evaluation.evaluate(ctx, state["policy"].params,
                                    rng=ctx.rng("eval", 0))
    ctx.writer.write(STAGE, step, last_eval)
  summary = dict(last_eval)
  summary.update({"rl/steps": step, "rl/seconds": seconds,
                  "rl/samples": step * rollout_batch,
                  "rl/skipped_updates": int(state["policy"].skipped)})
  ckpt.mark_done(step, summary)
  ckpt.close()
  return state["policy"].params, summary
