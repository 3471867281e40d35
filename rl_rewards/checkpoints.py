"""Checkpoints of training state: the only module that imports orbax.

One `Checkpointer` per stage directory (`<workdir>/checkpoints/<stage>`). A
checkpoint holds a pytree of arrays (`state`) and a small JSON dict (`meta`:
stage progress, data position, timings). Orbax writes each step to a temporary
directory and renames it when complete, so a process killed mid-write leaves
the previous checkpoint as the latest complete one; incomplete directories are
ignored, and removed when the next run opens the stage.

With `async_save`, `save` returns once the arrays are copied off the
devices and orbax writes them in a background thread; the next `save`,
`restore`, `mark_done` and `close` wait for it, so a stage is never marked
done before its last checkpoint is complete.
"""

import json
import os
import re
import shutil
import time

import jax
import orbax.checkpoint as ocp

from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards import kill_points
from rl_rewards import metrics as metrics_lib

_DONE_FILE = "stage_done.json"
# Orbax writes step N to "N.orbax-checkpoint-tmp-<id>" and renames it to "N"
# once complete.
_TMP_STEP_DIR = re.compile(r"^\d+\.orbax-checkpoint-tmp")


class Checkpointer:
  """Saves and restores `(state, meta)` pairs for one stage."""

  def __init__(self, directory: str, max_to_keep: int = 2, *,
               async_save: bool = False, extra_meta=None,
               cleanup: bool = True):
    """Opens (and creates) a stage's checkpoint directory.

    Args:
      directory: the stage's directory.
      max_to_keep: complete checkpoints kept (older ones are deleted).
      async_save: write checkpoints in a background thread.
      extra_meta: `() -> dict` merged into every saved meta dict (e.g. the
        metrics position the checkpoint corresponds to), or None.
      cleanup: remove temporary directories of interrupted writes (False
        for reading another run's checkpoints).
    """
    self.directory = os.path.abspath(directory)
    self._extra_meta = extra_meta
    self._async = async_save
    if (cleanup and os.path.isdir(self.directory)
        and metrics_lib.is_primary()):
      # Done before orbax opens the directory: orbax's own clean-up of
      # temporary step directories runs in a background thread, so it may
      # not have happened yet when the caller looks at the directory.
      for name in os.listdir(self.directory):
        path = os.path.join(self.directory, name)
        if name.startswith(_DONE_FILE + ".tmp"):  # A killed mark_done's.
          os.remove(path)
        elif _TMP_STEP_DIR.match(name) and os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)  # A killed save's.
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True,
            cleanup_tmp_directories=cleanup,
            enable_async_checkpointing=async_save),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()},
    )

  def latest_step(self):
    """The step of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def save(self, step: int, state, meta: dict):
    """Writes a checkpoint for `step`: complete on return, or (async_save)
    in flight, with its arrays already copied.

    A full disk raises `OSError` (ENOSPC) naming the checkpoint; its partial
    files are removed and the earlier checkpoints stay restorable.
    """
    if self._extra_meta is not None:
      meta = dict(meta, **self._extra_meta())
    kill_points.point("checkpoint.save")
    try:
      self._manager.save(
          int(step),
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(state),
              meta=ocp.args.JsonSave(meta)),
          force=True)
      if not self._async:
        self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      if not errors.is_disk_full(e):
        raise
      self._remove_partial_save(step)
      raise errors.disk_full(
          os.path.join(self.directory, str(int(step))),
          f"the latest complete checkpoint (step {self.latest_step()}) is "
          "intact and a rerun resumes from it") from e
    kill_points.point("checkpoint.saved")

  def _remove_partial_save(self, step, quiet_seconds=0.5,
                           limit_seconds=30.0):
    """Removes the temporary directory of a failed save of `step`.

    Orbax raises at the first failed write, while tensorstore's own threads
    may still be writing array chunks of the same save, and recreate the
    directory once it is removed. So it is removed until it has stayed absent
    for `quiet_seconds` (at most `limit_seconds`; whatever lands later is
    removed when the stage is next opened).
    """
    prefix = f"{int(step)}.orbax-checkpoint-tmp"
    start = quiet_since = time.monotonic()
    while True:
      found = [n for n in os.listdir(self.directory) if n.startswith(prefix)]
      for name in found:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
      now = time.monotonic()
      if found:
        quiet_since = now
      if (now - quiet_since >= quiet_seconds
          or now - start >= limit_seconds):
        return
      time.sleep(0.02)

  def wait(self):
    """Blocks until every checkpoint write in flight is complete."""
    self._manager.wait_until_finished()

  def restore(self, abstract_state, step=None):
    """Restores `(state, meta)`; `abstract_state` fixes structure and sharding.

    Args:
      abstract_state: a pytree of `jax.ShapeDtypeStruct` (with shardings) or of
        arrays, shaped like the saved state.
      step: which checkpoint (default: the latest).

    Returns:
      The restored state (placed with the shardings of `abstract_state`) and
      the meta dict.
    """
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No complete checkpoint in {self.directory}.")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    self._check_matches(int(step), target)
    restored = self._manager.restore(
        int(step),
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def _check_matches(self, step: int, target):
    """Raises InputError when the saved state has other names or shapes."""
    saved = _shapes(self._manager.item_metadata(step)["state"])
    wanted = _shapes(target)
    problems = [f"{k} has shape {saved[k]} in the checkpoint, {wanted[k]} "
                "here" for k in wanted if k in saved and saved[k] != wanted[k]]
    for label, keys in (("not in the checkpoint", set(wanted) - set(saved)),
                        ("only in the checkpoint", set(saved) - set(wanted))):
      if keys:
        problems.append(f"{label}: {', '.join(sorted(keys)[:4])}")
    if problems:
      raise errors.InputError(
          f"{os.path.join(self.directory, str(step))}: the checkpoint does "
          "not match the state of this run (written with another config?): "
          f"{'; '.join(problems[:4])}.")

  def restore_meta(self, step=None) -> dict:
    """The meta dict of a checkpoint (default: the latest), without its
    arrays."""
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No complete checkpoint in {self.directory}.")
    restored = self._manager.restore(
        int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  def restore_raw(self, step=None):
    """The saved state as host numpy arrays, without a target structure.

    Works whatever devices and processes wrote the checkpoint: every process
    reads the whole state onto one of its own devices.
    """
    self.wait()
    step = self.latest_step() if step is None else step
    metadata = self._manager.item_metadata(int(step))["state"]
    local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=local),
        metadata)
    restored = self._manager.restore(
        int(step),
        args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return jax.device_get(restored["state"])

  def mark_done(self, step: int, summary: dict):
    """Records that the stage finished at `step` (atomic JSON write, by the
    primary process of a multi-process run), once every checkpoint write in
    flight is complete."""
    self.wait()
    if not metrics_lib.is_primary():
      return
    path = os.path.join(self.directory, _DONE_FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump({"step": int(step), "summary": summary}, f, indent=2,
                sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    kill_points.point("checkpoint.done")
    os.replace(tmp, path)

  def done_info(self):
    """`{"step", "summary"}` if the stage finished, else None."""
    path = os.path.join(self.directory, _DONE_FILE)
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def close(self):
    self._manager.close()


def _shapes(tree) -> dict:
  """{"a/b/c": shape} of a pytree of arrays, shape structs or metadata."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(str(getattr(k, "key", getattr(k, "name", getattr(
      k, "idx", k)))) for k in path): tuple(getattr(leaf, "shape", ()))
          for path, leaf in flat}


def restore_finished(workdir: str, stage: str, key: str):
  """(state as host arrays, done info) of `workdir`'s finished `stage`.

  Raises:
    config_lib.ConfigError naming `key` (the config key that pointed at
    `workdir`) when the stage has not finished there.
  """
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints", stage),
                      cleanup=False)
  try:
    done = ckpt.done_info()
    if done is None:
      raise config_lib.ConfigError(
          f"config.{key}: {workdir} has no finished {stage} stage (no "
          f"{stage} checkpoint marked done).")
    return ckpt.restore_raw(done["step"]), done
  finally:
    ckpt.close()
