"""Checkpoints under faults: interrupted writes, async saves, extra meta."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import kill_points


class _Killed(BaseException):
  pass


def _state(value):
  return {"w": jnp.full((64,), value, jnp.float32), "n": jnp.int32(value)}


def test_interrupted_writes_leave_the_last_complete_checkpoint(tmp_path,
                                                               monkeypatch):
  directory = str(tmp_path / "ck")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(1, _state(1.0), {"at": 1})
  ckpt.close()
  # What kills mid-write leave: orbax's temporary step directory, a done
  # marker's temporary file.
  os.makedirs(os.path.join(directory, "2.orbax-checkpoint-tmp-123", "state"))
  open(os.path.join(directory, "stage_done.json.tmp999"), "w").close()
  ckpt = checkpoints.Checkpointer(directory)
  assert ckpt.latest_step() == 1
  assert sorted(os.listdir(directory)) == ["1"]  # Both removed.
  state, meta = ckpt.restore(_state(0.0))
  np.testing.assert_array_equal(state["w"], np.full((64,), 1.0))
  assert meta == {"at": 1}
  # A kill inside mark_done leaves the stage unfinished.
  monkeypatch.setenv(kill_points.KILL_ENV, "checkpoint.done:1")
  kill_points.reset()
  monkeypatch.setattr(kill_points, "kill_now",
                      lambda: (_ for _ in ()).throw(_Killed()))
  with pytest.raises(_Killed):
    ckpt.mark_done(1, {"done": True})
  monkeypatch.delenv(kill_points.KILL_ENV)
  kill_points.reset()
  assert ckpt.done_info() is None
  ckpt.mark_done(1, {"done": True})
  assert ckpt.done_info() == {"step": 1, "summary": {"done": True}}
  ckpt.close()


def test_reading_another_run_removes_nothing(tmp_path):
  directory = str(tmp_path / "ck")
  os.makedirs(os.path.join(directory, "2.orbax-checkpoint-tmp-1"))
  checkpoints.Checkpointer(directory, cleanup=False).close()
  assert os.listdir(directory) == ["2.orbax-checkpoint-tmp-1"]


def test_extra_meta_is_saved_with_every_checkpoint(tmp_path):
  count = {"n": 3}
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ck"),
                                  extra_meta=lambda: {"records": count["n"]})
  ckpt.save(1, _state(1.0), {"at": 1})
  count["n"] = 7
  ckpt.save(2, _state(2.0), {"at": 2})
  assert ckpt.restore_meta() == {"at": 2, "records": 7}
  assert ckpt.restore_meta(1) == {"at": 1, "records": 3}
  ckpt.close()


def test_async_save_survives_donation_and_waits_before_done(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ck"), async_save=True)
  state = _state(5.0)
  step = jax.jit(lambda s: jax.tree.map(lambda x: x * 3 + 1, s),
                 donate_argnums=0)
  ckpt.save(1, state, {"at": 1})
  for _ in range(3):  # Overwrites the donated buffers while orbax writes.
    state = step(state)
  ckpt.mark_done(1, {"ok": True})  # Waits for the write first.
  assert ckpt.latest_step() == 1
  restored, meta = ckpt.restore(_state(0.0))
  np.testing.assert_array_equal(restored["w"], np.full((64,), 5.0))
  assert int(restored["n"]) == 5 and meta == {"at": 1}
  ckpt.close()
