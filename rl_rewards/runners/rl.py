"""The RL stage: rollouts → rewards → advantages → PPO-clip policy updates.

One RL step:
  1. rollout: `prompts_per_step` fresh train problems, `group_size` samples
     each (the n samples of a prompt are contiguous rows);
  2. reward: decode, score with the task's verifier (outcome reward) and its
     step checker (ground-truth step labels, logged for analysis);
  3. advantages: the configured group estimator on the outcome scores,
     broadcast to every response token;
  4. update: `epochs` passes of `minibatches` PPO-clip steps.

Everything random is keyed by (seed, step) and the prompts of step s are a
pure function of s, so a resumed run reproduces an uninterrupted one exactly.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import core
from rl_rewards import metrics as metrics_lib
from rl_rewards.rollout import sampler
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import evaluation
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import optim
from rl_rewards.train import steps

STAGE = "rl"


def make_tx(rl_config):
  return optim.make_optimizer(
      learning_rate=rl_config.learning_rate,
      warmup_steps=rl_config.warmup_steps,
      weight_decay=rl_config.weight_decay, b2=rl_config.b2,
      grad_clip=rl_config.grad_clip)


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


def make_advantage_fn(rl_config):
  """`(scores [B], response_mask [B, T]) -> advantages [B, T]` (jitted)."""

  def advantage_fn(scores, response_mask):
    seq_adv = core.group_advantages(
        scores, rl_config.group_size, estimator=rl_config.advantage_estimator,
        eps=rl_config.advantage_eps)
    return core.broadcast_to_tokens(seq_adv, response_mask)

  return jax.jit(advantage_fn)


def rollout_metrics(scored, out_lengths, group_size: int) -> dict:
  """Reward and behaviour statistics of a scored rollout batch."""
  rewards = scored.rewards
  groups = rewards.reshape(-1, group_size)
  mixed = np.mean(groups.max(axis=1) != groups.min(axis=1))
  all_steps = np.array([len(l) > 0 and all(l) for l in scored.step_labels])
  return {
      "train/reward_mean": float(rewards.mean()),
      "train/mixed_groups": float(mixed),
      "train/response_length": float(np.mean(out_lengths)),
      "train/steps_per_response": float(scored.num_steps.mean()),
      "train/all_steps_correct": float(all_steps.mean()),
      "train/correct_with_wrong_step": float(
          np.mean((rewards > 0) & ~all_steps)),
  }


def run(ctx, params, ref_params=None):
  """Runs (or resumes, or reuses) the RL stage from policy `params`.

  Args:
    ctx: the run context.
    params: the initial policy (the SFT result).
    ref_params: the reference policy for the KL penalty (default `params`).

  Returns:
    (final policy params, stage summary dict).
  """
  cfg = ctx.config.rl
  rollout_batch = cfg.prompts_per_step * cfg.group_size
  mesh_lib.check_batch_divides(rollout_batch // cfg.minibatches, ctx.mesh,
                               "config.rl (rollout minibatch)")
  mesh_lib.check_batch_divides(cfg.prompts_per_step, ctx.mesh,
                               "config.rl.prompts_per_step")
  ref_params = params if ref_params is None else ref_params
  tx = make_tx(cfg)
  state, shardings = context_lib.create_state(
      ctx.model_config, ctx.mesh, params, tx)
  ckpt = ctx.checkpointer(STAGE)
  meta = {"seconds": 0.0, "initial_eval": None}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    if (done is not None and done["step"] == int(state.step) and
        done["step"] >= cfg.steps):
      print(f"[rl] reusing the finished stage (step {done['step']})")
      ckpt.close()
      return state.params, done["summary"]
    ctx.writer.drop_after(ctx.stage_order, STAGE, int(state.step))
    print(f"[rl] resuming from step {int(state.step)}")

  batch_sharding = mesh_lib.batch_sharding(ctx.mesh)
  policy_step = steps.make_policy_step(
      ctx.model_config, tx, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
      clip_c=cfg.clip_c, loss_agg_mode=cfg.loss_agg_mode,
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
      loss_scale=float(ctx.task.max_new_tokens))
  jit_step = jax.jit(policy_step, in_shardings=(shardings, batch_sharding),
                     out_shardings=(shardings, None), donate_argnums=0)
  advantage_fn = make_advantage_fn(cfg)
  logprob_fn = jax.jit(steps.make_logprob_fn(ctx.model_config))

  step = int(state.step)
  if meta["initial_eval"] is None:
    meta["initial_eval"] = evaluation.evaluate(
        ctx, state.params, rng=ctx.rng("eval", 0), with_pass_n=False)
    ctx.writer.write(STAGE, 0, meta["initial_eval"])
  seconds = float(meta["seconds"])
  last_eval = dict(meta["initial_eval"])

  while step < cfg.steps and not (cfg.max_seconds and
                                  seconds >= cfg.max_seconds):
    t0 = time.time()
    out, scored, info = rollout(ctx, state.params, step)
    t1 = time.time()
    rewards = jnp.asarray(scored.rewards)
    advantages = advantage_fn(rewards, out.response_mask)
    batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
             "response_mask": out.response_mask,
             "old_logprobs": out.logprobs, "advantages": advantages}
    if cfg.kl_coef > 0:
      batch["ref_logprobs"] = logprob_fn(ref_params, out.tokens,
                                         out.attention_mask)
    t2 = time.time()
    size = rollout_batch // cfg.minibatches
    for _ in range(cfg.epochs):
      for m in range(cfg.minibatches):
        minibatch = jax.tree.map(lambda x: x[m * size:(m + 1) * size], batch)
        minibatch = jax.device_put(minibatch, batch_sharding)
        state, update_metrics = jit_step(state, minibatch)
    record = context_lib.host_scalars(update_metrics)
    t3 = time.time()
    step += 1
    seconds += t3 - t0
    record = {f"train/{k}": v for k, v in record.items()}
    record.update(rollout_metrics(scored, info["lengths"], cfg.group_size))
    record.update({
        "time/rollout_s": t1 - t0 - info["reward_s"],
        "time/reward_s": info["reward_s"],
        "time/advantage_s": t2 - t1, "time/update_s": t3 - t2,
        "time/step_s": t3 - t0,
        "perf/tokens_per_sec": info["num_tokens"] / max(t3 - t0, 1e-9),
        "perf/rollout_tokens_per_sec": (
            info["num_tokens"] / max(t1 - t0 - info["reward_s"], 1e-9)),
    })
    if step % cfg.eval_every_steps == 0 or step == cfg.steps:
      te = time.time()
      last_eval = evaluation.evaluate(ctx, state.params,
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

  if "eval/pass@%d" % ctx.config.eval.pass_n not in last_eval and (
      ctx.config.eval.pass_n > 1):
    last_eval = evaluation.evaluate(ctx, state.params, rng=ctx.rng("eval", 0))
    ctx.writer.write(STAGE, step, last_eval)
  summary = dict(last_eval)
  summary.update({"rl/steps": step, "rl/seconds": seconds,
                  "rl/skipped_updates": int(state.skipped)})
  ckpt.mark_done(step, summary)
  ckpt.close()
  return state.params, summary
