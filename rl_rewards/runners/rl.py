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
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import optim
from rl_rewards.train import steps

STAGE = "rl"


def _tx(cfg, learning_rate):
  return optim.make_optimizer(
      learning_rate=learning_rate, warmup_steps=cfg.warmup_steps,
      weight_decay=cfg.weight_decay, b2=cfg.b2, grad_clip=cfg.grad_clip)


def rollout_problems(ctx, step: int):
  cfg = ctx.config.rl
  start = tasks_lib.RL_INDEX_OFFSET + step * cfg.prompts_per_step
  return ctx.task.problems("train", start, cfg.prompts_per_step)


def rollout(ctx, params, step: int):
  """Samples and scores the rollout batch of `step`.

  Returns:
    (sample output on device, scored verdicts on host, host info dict with
    `lengths` [N], `num_tokens` and `reward_s`, the scoring time).
  """
  cfg = ctx.config.rl
  task = ctx.task
  problems = rollout_problems(ctx, step)
  tokens, mask = mesh_lib.put_batch(task.encode_prompts(problems), ctx.mesh)
  out = sampler.sample(
      ctx.model_config, params, tokens, mask, ctx.rng("rollout", step),
      max_new_tokens=task.max_new_tokens, temperature=cfg.temperature,
      top_p=cfg.top_p, eos_id=task.tokenizer.eos_id,
      pad_id=task.tokenizer.pad_id, delimiter_mask=task.delimiter_mask(),
      num_samples=cfg.group_size)
  host = mesh_lib.to_host({"tokens": out.tokens,
                           "response_mask": out.response_mask,
                           "truncated": out.truncated, "lengths": out.lengths})
  t0 = time.time()
  texts = task.decode_responses(host["tokens"], host["response_mask"])
  repeated = [p for p in problems for _ in range(cfg.group_size)]
  scored = task.score(repeated, texts, ~host["truncated"])
  info = {"lengths": host["lengths"], "num_tokens": int(host["lengths"].sum()),
          "reward_s": time.time() - t0}
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
  wrong step.
  """
  rewards = scored.rewards
  groups = rewards.reshape(-1, group_size)
  mixed = np.mean(groups.max(axis=1) != groups.min(axis=1))
  all_steps = np.array([len(l) > 0 and all(l) for l in scored.step_labels])
  steps_per = np.maximum(scored.num_steps, 1)
  out = {
      "train/reward_mean": float(rewards.mean()),
      "train/mixed_groups": float(mixed),
      "train/response_length": float(np.mean(lengths)),
      "train/steps_per_response": float(scored.num_steps.mean()),
      "train/tokens_per_step": float(np.mean(lengths / steps_per)),
      "train/empty_step_fraction": float(scored.empty_steps.sum() /
                                         max(scored.num_steps.sum(), 1)),
  }
  if has_step_labels:
    out["train/all_steps_correct"] = float(all_steps.mean())
    out["train/correct_with_wrong_step"] = float(
        np.mean((rewards > 0) & ~all_steps))
  return out


def prm_agreement_metrics(step_scores, step_ids, oracle_labels, rewards):
  """How a PRM's step scores agree with the verifier and the step checker.

  `prm/verifier_agreement`: the response-level verdict "min step score ≥ ½"
  equals the outcome reward; `prm/step_label_agreement`: per-step verdicts
  equal the ground-truth labels; `prm/min_step_position`: where in the
  response (0 = first step, 1 = last) the lowest score sits.
  """
  ids = np.asarray(step_ids)
  num_steps = np.maximum(ids.max(axis=1) + 1, 1)
  scores = np.asarray(step_scores)
  valid = np.arange(scores.shape[1])[None, :] < num_steps[:, None]
  masked = np.where(valid, scores, np.inf)
  min_score = masked.min(axis=1)
  argmin = masked.argmin(axis=1)
  predicted_ok = min_score >= 0.5
  step_agree = ((scores >= 0.5) == (oracle_labels >= 0.5))[valid]
  return {
      "prm/verifier_agreement": float(np.mean(predicted_ok == (rewards > 0))),
      "prm/step_label_agreement": float(step_agree.mean()),
      "prm/min_step_position": float(np.mean(
          argmin / np.maximum(num_steps - 1, 1))),
      "prm/min_at_last_step": float(np.mean(argmin == num_steps - 1)),
      "prm/mean_step_score": float(scores[valid].mean()),
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
  chunk = ctx.config.model.logits_chunk
  method = cfg.method
  uses_prm = method in credit.PRM_METHODS
  if uses_prm and cfg.prm_source == "model" and prm is None:
    raise ValueError(
        f"config.rl.method={method!r} with prm_source='model' needs a trained "
        "PRM: add the 'labels' and 'prm' stages, or set config.prm.init_from, "
        "or use config.rl.prm_source='oracle'.")
  ref_params = params if ref_params is None else ref_params

  # ---------------------------------------------------------------- state ---
  tx = _tx(cfg, cfg.learning_rate)
  policy, policy_sh = context_lib.create_state(ctx.model_config, ctx.mesh,
                                               params, tx)
  state, shardings = {"policy": policy}, {"policy": policy_sh}
  if method == "ppo":
    value_tx = _tx(cfg, cfg.value_learning_rate)
    value_params = models.init_from_backbone(
        ctx.model_config, jax.device_get(params), ctx.rng("value_init"),
        heads=("score",))
    state["value"], shardings["value"] = context_lib.create_state(
        ctx.model_config, ctx.mesh, value_params, value_tx, heads=("score",))
  if method == "prime":
    prm_tx = _tx(cfg, cfg.prime_learning_rate)
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

  def jit_update(fn, name):
    return jax.jit(fn, in_shardings=(shardings[name], batch_sharding),
                   out_shardings=(shardings[name], None), donate_argnums=0)

  # Updates accumulate gradients over micro-batches of `micro_batch_size`
  # rows; the passes over the rollout (reference and implicit-PRM log-probs,
  # values) run `pass_rows` rows at a time inside one jitted function.
  policy_step = jit_update(steps.make_policy_step(
      ctx.model_config, tx, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
      clip_c=cfg.clip_c, loss_agg_mode=cfg.loss_agg_mode,
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
      loss_scale=float(ctx.task.max_new_tokens),
      micro_batch_size=cfg.micro_batch_size, chunk_size=chunk), "policy")
  if method == "ppo":
    value_step = jit_update(steps.make_value_step(
        ctx.model_config, value_tx, clip_range=cfg.value_clip,
        micro_batch_size=cfg.micro_batch_size), "value")
    values_fn = jax.jit(steps.make_values_fn(ctx.model_config,
                                             micro_batch_size=pass_rows))
  if method == "prime":
    prm_step = jit_update(steps.make_implicit_prm_step(
        ctx.model_config, prm_tx, beta=cfg.prime_beta,
        group_size=cfg.group_size, micro_batch_size=cfg.micro_batch_size,
        chunk_size=chunk), "implicit_prm")
  logprob_fn = jax.jit(steps.make_logprob_fn(
      ctx.model_config, micro_batch_size=pass_rows, chunk_size=chunk))
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
    out, scored, info = rollout(ctx, state["policy"].params, step)
    t1 = time.time()
    record = {}
    step_ids = clamp(out.step_ids)
    batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
             "response_mask": out.response_mask, "step_ids": step_ids,
             "old_logprobs": out.logprobs,
             "rewards": jnp.asarray(scored.rewards)}
    weights = np.ones((rollout_batch,), np.float32)
    if cfg.filter_accuracy:
      weights = accuracy_filter(scored.rewards, cfg.group_size,
                                cfg.filter_accuracy_low,
                                cfg.filter_accuracy_high)
      record["train/kept_fraction"] = float(weights.mean())

    # Process signal.
    if ctx.task.has_step_labels and (uses_prm or cfg.log_oracle_agreement):
      oracle = credit.oracle_step_arrays(scored.step_labels, num_steps)
    if uses_prm:
      if cfg.prm_source == "oracle":
        scores = {"step_scores": oracle["labels"],
                  "q_steps": oracle["q_steps"], "v_init": oracle["v_init"]}
      else:
        scores = prm.score_rollout(out.tokens, out.attention_mask, step_ids)
        scores["q_steps"] = scores["step_scores"]
        if ctx.task.has_step_labels:
          record.update(prm_agreement_metrics(
              scores["step_scores"], step_ids, oracle["labels"],
              scored.rewards))
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
