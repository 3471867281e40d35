"""The SFT stage: warm-start the policy on reference solutions.

SFT stops on a target held-out accuracy rather than a fixed step count (a
quick greedy "gate" eval every `gate_every_steps`), with a step cap as the
safety net: on the arithmetic task accuracy jumps from ~0 to 40-60 % at a
time that varies by seed (docs/arith_task.md), so a fixed budget either
wastes time or stops before the jump. A wall-clock cap (`max_seconds`) is an
opt-in: it makes a slower machine stop at another step.

The batch of step s is a pure function of s (fresh problems s·B … s·B+B−1 of
the train split, or a fixed set of `dataset_size` problems reshuffled every
epoch), so a resumed run sees exactly the batches an uninterrupted one would.
"""

import time

import jax
import numpy as np

from rl_rewards import checkpoints
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.data import order
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import evaluation
from rl_rewards.runners import programs
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import nonfinite

STAGE = "sft"


def _batch_indices(sft_config, seed, step):
  size, batch = sft_config.dataset_size, sft_config.batch_size
  if size <= 0:  # Fresh problems every step.
    return np.arange(step * batch, (step + 1) * batch)
  return order.epoch_order(size, batch, seed, step)


def make_batch(ctx, step: int, rows: slice = slice(None)):
  """Rows `rows` of the SFT batch of `step` (host numpy arrays)."""
  indices = _batch_indices(ctx.config.sft, ctx.config.seed, step)[rows]
  problems = [ctx.task.problems("train", int(i), 1)[0] for i in indices]
  return ctx.task.encode_sft(problems)


def put_step_batch(ctx, step: int):
  """The SFT batch of `step` on the mesh; this process builds its rows only."""
  size = ctx.config.sft.batch_size
  rows = mesh_lib.process_rows(size, ctx.mesh)
  return mesh_lib.put_local_batch(make_batch(ctx, step, rows), ctx.mesh, size)


def load_finished(ctx, workdir: str):
  """The policy and summary of a finished SFT stage in another workdir."""
  state, done = checkpoints.restore_finished(workdir, STAGE, "sft.init_from")
  params = context_lib.place_params(ctx, state["params"],
                                   source=f"config.sft.init_from: {workdir}")
  print(f"[sft] reusing the finished SFT policy of {workdir} "
        f"(step {done['step']})")
  return params, dict(done["summary"], **{"sft/init_from": workdir})


def run(ctx, params=None):
  """Runs (or resumes, or reuses) the SFT stage.

  Args:
    ctx: the run context.
    params: initial policy parameters (None: a fresh init).

  Returns:
    (policy params, stage summary dict).
  """
  cfg = ctx.config.sft
  if cfg.init_from:
    return load_finished(ctx, cfg.init_from)
  mesh_lib.check_batch_divides(cfg.batch_size, ctx.mesh, "config.sft")
  if cfg.micro_batch_size:
    mesh_lib.check_batch_divides(cfg.micro_batch_size, ctx.mesh,
                                 "config.sft.micro_batch_size")
  tx = programs.sft_optimizer(cfg)
  if params is None:
    params = models.init_params(ctx.model_config, ctx.rng("init"))
  state, shardings = context_lib.create_state(
      ctx.model_config, ctx.mesh, params, tx)
  ckpt = ctx.checkpointer(STAGE)
  meta = {"compute_seconds": 0.0, "gate_accuracy": None,
          "converged": False, "stopped": False, "skip_run": 0}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    if done is not None and done["step"] == int(state.step):
      print(f"[sft] reusing the finished stage (step {done['step']})")
      ckpt.close()
      return state.params, done["summary"]
    ctx.writer.drop_after(ctx.stage_order, STAGE, int(state.step))
    print(f"[sft] resuming from step {int(state.step)}")

  jit_step = programs.jit_update(
      programs.sft_step_fn(ctx.config, ctx.model_config, tx), shardings,
      ctx.mesh)
  gate_problems = ctx.task.problems("valid", 0, cfg.gate_eval_size)

  step = int(state.step)
  compute = float(meta["compute_seconds"])
  last = log_time = time.time()
  stopped, converged = bool(meta["stopped"]), bool(meta["converged"])
  guard = nonfinite.SkipGuard(STAGE, ctx.config.train.max_consecutive_skips,
                              run=int(meta.get("skip_run", 0)))
  while not stopped:
    batch = put_step_batch(ctx, step)
    state, step_metrics = jit_step(state, batch)
    step += 1
    guard.observe(step, step_metrics["skipped"])
    if step % cfg.log_every_steps == 0:
      values = context_lib.host_scalars(step_metrics)
      now = time.time()
      compute += now - last
      tokens_per_sec = (values["tokens"] * cfg.log_every_steps /
                        max(now - log_time, 1e-9))
      last = log_time = now
      record = {f"train/{k}": v for k, v in values.items()}
      record.update({"train/skipped_updates": int(state.skipped),
                     "perf/tokens_per_sec": tokens_per_sec,
                     "time/compute_s": compute})
      ctx.writer.write(STAGE, step, record)
      metrics_lib.print_status(metrics_lib.format_status(
          STAGE, step, cfg.max_steps, record,
          ("train/loss", "perf/tokens_per_sec", "time/compute_s")))
    if step % cfg.gate_every_steps == 0:
      compute += time.time() - last
      gate = evaluation.greedy_accuracy(
          ctx, state.params, gate_problems,
          batch_size=ctx.config.eval.batch_size, rng=ctx.rng("gate", step))
      last = log_time = time.time()
      meta["gate_accuracy"] = gate["eval/accuracy"]
      ctx.writer.write(STAGE, step, {"gate/accuracy": gate["eval/accuracy"]})
      metrics_lib.print_status(
          f"[sft] step {step}: gate accuracy {gate['eval/accuracy']:.3f} "
          f"(target {cfg.target_accuracy:.2f}; {compute:.0f}s of compute)")
      if gate["eval/accuracy"] >= cfg.target_accuracy:
        stopped, converged = True, True
    if step >= cfg.max_steps or (cfg.max_seconds and
                                 compute >= cfg.max_seconds):
      stopped = True
    if stopped or step % cfg.checkpoint_every_steps == 0:
      meta.update(compute_seconds=compute, converged=converged,
                  stopped=stopped, skip_run=guard.flush())
      ckpt.save(step, state, meta)
  guard.flush()

  final = evaluation.evaluate(ctx, state.params, rng=ctx.rng("eval", 0))
  summary = dict(final)
  summary.update({"sft/steps": step, "sft/compute_seconds": compute,
                  "sft/converged": converged,
                  "sft/gate_accuracy": meta["gate_accuracy"],
                  "sft/skipped_updates": int(state.skipped)})
  ctx.writer.write(STAGE, step, final)
  if not converged:
    metrics_lib.print_status(
        f"[sft] WARNING: SFT stopped at step {step} without reaching the "
        f"target accuracy {cfg.target_accuracy} (gate accuracy "
        f"{meta['gate_accuracy']}).")
  ckpt.mark_done(step, summary)
  ckpt.close()
  return state.params, summary


CONTINUE_STAGE = "sft_continue"
# Problem indices of the SFT-continued baseline (fresh problems, distinct
# from the SFT, RL and labelling streams).
CONTINUE_INDEX_OFFSET = 30_000_000


def run_continue(ctx, params):
  """The SFT-continued baseline: more SFT from the SFT policy.

  Comparisons of RL methods always include this baseline at equal compute:
  it trains for `config.sft.continue_seconds` of wall-clock time (set it to
  the RL stage's time) with a fresh optimizer, evaluating every
  `continue_eval_every_seconds`. Being budgeted in seconds, it is not
  bit-exactly resumable; a killed run resumes from its last checkpoint.

  Returns:
    (params, stage summary dict).
  """
  cfg = ctx.config.sft
  if cfg.continue_seconds <= 0:
    raise config_lib.ConfigError(
        "config.sft.continue_seconds must be > 0 for the sft_continue stage.")
  tx = programs.sft_optimizer(cfg)
  state, shardings = context_lib.create_state(
      ctx.model_config, ctx.mesh, params, tx)
  ckpt = ctx.checkpointer(CONTINUE_STAGE)
  meta = {"seconds": 0.0, "next_eval": cfg.continue_eval_every_seconds}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(context_lib.abstract_like(state, shardings))
    done = ckpt.done_info()
    if done is not None and done["step"] == int(state.step):
      ckpt.close()
      return state.params, done["summary"]
    ctx.writer.drop_after(ctx.stage_order, CONTINUE_STAGE, int(state.step))
  jit_step = programs.jit_update(
      programs.sft_step_fn(ctx.config, ctx.model_config, tx), shardings,
      ctx.mesh)
  step, seconds = int(state.step), float(meta["seconds"])
  if step == 0:
    initial = evaluation.evaluate(ctx, state.params, rng=ctx.rng("eval", 0),
                                  with_pass_n=False)
    ctx.writer.write(CONTINUE_STAGE, 0, dict(initial, seconds=0.0, samples=0))
  last, compiling = time.time(), True
  guard = nonfinite.SkipGuard(CONTINUE_STAGE,
                              ctx.config.train.max_consecutive_skips,
                              run=int(meta.get("skip_run", 0)))
  while seconds < cfg.continue_seconds:
    batch = put_step_batch(ctx,
                           step + CONTINUE_INDEX_OFFSET // cfg.batch_size)
    state, step_metrics = jit_step(state, batch)
    step += 1
    guard.observe(step, step_metrics["skipped"])
    if compiling:
      # The first step's time is compilation, not training compute.
      jax.block_until_ready(step_metrics)
      last, compiling = time.time(), False
    if step % cfg.log_every_steps == 0 or seconds >= meta["next_eval"]:
      values = context_lib.host_scalars(step_metrics)
      now = time.time()
      seconds += now - last
      last = now
      record = {f"train/{k}": v for k, v in values.items()}
      record.update(seconds=seconds, samples=step * cfg.batch_size)
      if seconds >= meta["next_eval"] or seconds >= cfg.continue_seconds:
        record.update(evaluation.evaluate(
            ctx, state.params, rng=ctx.rng("eval", 0), with_pass_n=False))
        meta["next_eval"] = seconds + cfg.continue_eval_every_seconds
        last = time.time()
        metrics_lib.print_status(
            f"[{CONTINUE_STAGE}] step {step}, {seconds:.0f}/"
            f"{cfg.continue_seconds:.0f}s: accuracy "
            f"{record['eval/accuracy']:.3f}")
      ctx.writer.write(CONTINUE_STAGE, step, record)
    if step % cfg.checkpoint_every_steps == 0:
      meta.update(seconds=seconds, skip_run=guard.flush())
      ckpt.save(step, state, meta)
  meta["skip_run"] = guard.flush()
  final = evaluation.evaluate(ctx, state.params, rng=ctx.rng("eval", 0))
  ctx.writer.write(CONTINUE_STAGE, step, dict(final, seconds=seconds,
                                              samples=step * cfg.batch_size))
  summary = dict(final, **{"sft_continue/steps": step,
                           "sft_continue/seconds": seconds,
                           "sft_continue/skipped_updates": int(state.skipped)})
  meta["seconds"] = seconds
  if ckpt.latest_step() != step:  # The loop may have just saved this step.
    ckpt.save(step, state, meta)
  ckpt.mark_done(step, summary)
  ckpt.close()
  return state.params, summary
