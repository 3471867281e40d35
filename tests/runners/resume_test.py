"""Where each stage resumes, and which metrics records it keeps."""

import os
import types

import jax.numpy as jnp

from rl_rewards import checkpoints
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.prm import label_store
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import resume


def _ctx(workdir, **init_from):
  config = config_lib.base_config()
  config.stages = "sft,labels,prm,rl"
  for section, path in init_from.items():
    config[section].init_from = path
  return types.SimpleNamespace(
      config=config, workdir=workdir,
      writer=metrics_lib.MetricsWriter(workdir),
      stage_order=["sft", "labels", "prm", "rl"])


def _save(workdir, stage, step, meta, done=False):
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", stage))
  ckpt.save(step, {"x": jnp.zeros(2)}, meta)
  if done:
    ckpt.mark_done(step, {})
  ckpt.close()


def test_resume_points(tmp_path):
  workdir = str(tmp_path)
  ctx = _ctx(workdir)
  position = context_lib.METRICS_POSITION
  assert resume.resume_point(ctx, "sft") == ("start", 0)
  _save(workdir, "sft", 4, {position: 7}, done=True)
  assert resume.resume_point(ctx, "sft") is None          # Finished.
  assert resume.resume_point(_ctx(workdir, sft="/elsewhere"), "sft") is None
  _save(workdir, "prm", 2, {position: 11})
  assert resume.resume_point(ctx, "prm") == ("records", 11)
  _save(workdir, "rl", 2, {"seconds": 1.0})               # An older run's.
  assert resume.resume_point(ctx, "rl") == ("step", 2)
  labels = os.path.join(workdir, "labels")
  assert resume.resume_point(ctx, "labels") == ("start", 0)
  record = {"split": "train", "index": 0, "question": "q", "prompt_ids": [1],
            "response_ids": [2], "text": "t", "finished": True,
            "outcome": 1.0, "q": [1.0], "hard": [1], "rollouts": [0],
            "v": None, "v_rollouts": 0, "oracle": None, "first_error": None}
  for shard, records in ((0, 8), (1, 9), (3, 12)):          # 3: not next.
    ctx.writer.num_records = records
    resume.record_shard_position(ctx, shard)
    label_store.write_shard(labels, shard, [record])
  resume.record_shard_position(ctx, 2)  # Shard 2 itself was never written.
  assert resume.resume_point(ctx, "labels") == ("records", 9)
  os.remove(resume.shard_position_path(workdir, 1))       # An older run's.
  assert resume.resume_point(ctx, "labels") == ("step", 2)


def test_rewind_truncates_to_the_checkpoint_or_drops_the_stage(tmp_path):
  workdir = str(tmp_path)
  ctx = _ctx(workdir)
  for stage, step in (("sft", 2), ("sft", 4), ("sft", 4), ("labels", 1)):
    ctx.writer.write(stage, step, {})
  # The sft checkpoint at step 4 was taken with 2 records written: the
  # later records of step 4 (a final evaluation) and of labels go.
  _save(workdir, "sft", 4, {context_lib.METRICS_POSITION: 2})
  resume.rewind_metrics(ctx, "sft")
  assert [(r["stage"], r["step"]) for r in
          metrics_lib.read_metrics(workdir)] == [("sft", 2), ("sft", 4)]
  ctx.writer.write("labels", 1, {})
  resume.rewind_metrics(ctx, "labels")                    # No shard yet.
  assert ctx.writer.num_records == 2
