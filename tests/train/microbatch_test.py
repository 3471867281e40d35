"""Micro-batch layout: row order, padding, accumulation, and no data moves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import microbatch


def test_split_takes_strided_rows():
  x = np.arange(8)
  # Micro-batch j of 2 holds rows {2i + j}.
  np.testing.assert_array_equal(microbatch.split_rows(x, 2),
                                [[0, 2, 4, 6], [1, 3, 5, 7]])
  # With groups of 2 (rows (0,1), (2,3), ...): micro-batch j holds whole
  # groups {2i + j}.
  np.testing.assert_array_equal(microbatch.split_rows(x, 2, group_size=2),
                                [[0, 1, 4, 5], [2, 3, 6, 7]])


@pytest.mark.parametrize("num,group_size", [(1, 1), (2, 1), (4, 1), (2, 2),
                                            (3, 2)])
def test_merge_inverts_split(num, group_size):
  tree = {"a": np.arange(12 * 3).reshape(12, 3), "b": np.arange(12) * 2.0}
  split = microbatch.split_rows(tree, num, group_size)
  assert split["a"].shape == (num, 12 // num, 3)
  merged = microbatch.merge_rows(split, group_size)
  for key in tree:
    np.testing.assert_array_equal(merged[key], tree[key])


def test_split_rejects_partial_groups():
  with pytest.raises(ValueError, match="whole groups"):
    microbatch.split_rows(np.arange(6), 2, group_size=2)


def test_num_micro_batches():
  assert microbatch.num_micro_batches(16, 0) == 1
  assert microbatch.num_micro_batches(16, 16) == 1
  assert microbatch.num_micro_batches(16, 4) == 4
  with pytest.raises(ValueError, match="does not divide"):
    microbatch.num_micro_batches(16, 6, what="config.sft")
  with pytest.raises(ValueError, match="exceeds"):
    microbatch.num_micro_batches(16, 32)
  with pytest.raises(ValueError, match="multiple of the group size"):
    microbatch.num_micro_batches(16, 2, group_size=4)


def _row_fn(batch):
  """A row-wise function with a per-row reduction and a [b, T] output."""
  x = batch["x"]
  return {"sum": jnp.sum(x * batch["w"][:, None], axis=1),
          "scaled": x * 2.0 + jnp.cumsum(x, axis=1)}


@pytest.mark.parametrize("rows,micro,group_size", [(12, 4, 1), (12, 3, 1),
                                                   (10, 4, 1), (12, 4, 2),
                                                   (10, 4, 2), (12, 0, 1)])
def test_map_rows_equals_whole_batch(rows, micro, group_size):
  rng = np.random.default_rng(0)
  batch = {"x": rng.standard_normal((rows, 5)).astype(np.float32),
           "w": rng.standard_normal(rows).astype(np.float32)}
  want = _row_fn(batch)
  got = jax.jit(lambda b: microbatch.map_rows(_row_fn, b, micro,
                                              group_size))(batch)
  for key in want:
    assert got[key].shape == want[key].shape
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6)


def test_map_rows_keeps_groups_together():
  # The output of a row depends on its group: the group sum, broadcast.
  def group_sum(b):
    x = b["x"].reshape(-1, 2)
    return jnp.repeat(jnp.sum(x, axis=1), 2)
  x = np.arange(12, dtype=np.float32)
  got = microbatch.map_rows(group_sum, {"x": x}, 4, group_size=2)
  np.testing.assert_array_equal(got, group_sum({"x": x}))


def test_accumulate_sums_parts():
  x = np.arange(24, dtype=np.float32).reshape(8, 3)
  fn = lambda b: {"total": jnp.sum(b), "rows": jnp.float32(b.shape[0])}
  for num in (1, 2, 4, 8):
    got = jax.jit(lambda b, n=num: microbatch.accumulate(fn, b, n))(x)
    assert float(got["total"]) == float(np.sum(x))
    assert float(got["rows"]) == 8  # Σ of the micro-batches' row counts.


def test_split_on_a_mesh_moves_no_data():
  mesh = mesh_lib.make_mesh(dict(data=4, fsdp=2, tensor=1))
  sharding = mesh_lib.batch_sharding(mesh)
  x = jax.device_put(np.arange(64 * 3, dtype=np.float32).reshape(64, 3),
                     sharding)
  fn = jax.jit(lambda v: microbatch.split_rows(v, 4), in_shardings=sharding)
  compiled = fn.lower(x).compile()
  text = compiled.as_text()
  for collective in ("all-to-all", "all-gather", "collective-permute",
                     "all-reduce"):
    assert collective not in text, collective
  out = fn(x)
  np.testing.assert_array_equal(out, np.asarray(x).reshape(16, 4, 3)
                                .swapaxes(0, 1))
  # Each device holds 2 rows of every micro-batch: its own rows, unmoved.
  for shard in out.addressable_shards:
    assert shard.data.shape == (4, 2, 3)
    device_rows = x.addressable_shards[
        [s.device for s in x.addressable_shards].index(shard.device)].data
    np.testing.assert_array_equal(
        np.asarray(shard.data).swapaxes(0, 1).reshape(8, 3), device_rows)
