"""Where a stage resumes, and the metrics records it will write again.

A run killed at any moment resumes every stage from its last complete
checkpoint (label shards: the last complete shard). Everything the stage
wrote to `metrics.jsonl` after that point will be written again, so before a
stage runs the pipeline calls `rewind_metrics`, which truncates the file
back to what it held when that checkpoint was taken: each checkpoint's meta
(and, for each label shard, `checkpoints/labels/shard-NNNNN.json`, written
just before the shard) records the number of metrics records at that moment
(`context.METRICS_POSITION`). That covers records written at the
checkpoint's own step after it was saved (the final evaluation, a stage's
summary record), which dropping by step number alone would keep twice. A
stage with no checkpoint yet drops all of its records (and any of later
stages); a finished stage, or one reused from another workdir, keeps them.
"""

import os

from rl_rewards import checkpoints
from rl_rewards import metrics as metrics_lib
from rl_rewards.prm import label_store
from rl_rewards.runners import context as context_lib

# Stages that `<section>.init_from` takes from another workdir.
_REUSED_BY = {"sft": "sft", "labels": "labels", "prm": "prm"}


def shard_position_path(workdir: str, shard: int) -> str:
  return os.path.join(workdir, "checkpoints", "labels",
                      f"shard-{shard:05d}.json")


def record_shard_position(ctx, shard: int):
  """Records the metrics position of label shard `shard` (call it after the
  shard's metrics record and before writing the shard)."""
  path = shard_position_path(ctx.workdir, shard)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  metrics_lib.write_json_atomic(
      path, {context_lib.METRICS_POSITION: ctx.writer.num_records})


def _contiguous(shards) -> int:
  count, present = 0, set(shards)
  while count in present:
    count += 1
  return count


def resume_point(ctx, stage: str):
  """What a resumed `stage` keeps of metrics.jsonl.

  Returns:
    None (the stage will not write: finished, or reused from another
    workdir), ("records", n) (keep the first n records), ("step", s) (keep
    the stage's records up to step s: checkpoints written before metrics
    positions were recorded), or ("start", 0) (nothing of the stage).
  """
  section = _REUSED_BY.get(stage)
  if section and ctx.config[section].init_from:
    return None
  ckpt = checkpoints.Checkpointer(
      os.path.join(ctx.workdir, "checkpoints", stage), cleanup=False)
  try:
    done, latest = ckpt.done_info(), ckpt.latest_step()
    if done is not None and (latest is None or done["step"] == latest):
      return None
    if stage == "labels":
      path = os.path.join(ctx.workdir, "labels")
      count = _contiguous(label_store.complete_shards(path))
      if count == 0:
        return ("start", 0)
      position = shard_position_path(ctx.workdir, count - 1)
      if os.path.exists(position):
        return ("records", int(metrics_lib.read_json(position)[
            context_lib.METRICS_POSITION]))
      return ("step", count)
    if latest is None:
      return ("start", 0)
    meta = ckpt.restore_meta(latest)
    if context_lib.METRICS_POSITION in meta:
      return ("records", int(meta[context_lib.METRICS_POSITION]))
    return ("step", latest)
  finally:
    ckpt.close()


def rewind_metrics(ctx, stage: str):
  """Drops the metrics records that running `stage` now will write again."""
  point = resume_point(ctx, stage)
  if point is None:
    return
  kind, value = point
  if kind == "records":
    ctx.writer.truncate(value)
  else:
    ctx.writer.drop_after(ctx.stage_order, stage,
                          value if kind == "step" else -1)
