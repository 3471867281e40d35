"""The resumable visiting order of a fixed training set."""

import numpy as np
import pytest

from rl_rewards.data import order


def _stream(num_items, seed, epochs):
  """The documented stream: epoch e is the permutation seeded by (seed, e)."""
  return np.concatenate([
      np.random.default_rng([seed, e]).permutation(num_items)
      for e in range(epochs)])


def test_every_epoch_visits_each_item_once():
  num_items, batch = 7, 3
  stream = np.concatenate([order.epoch_order(num_items, batch, 5, step)
                           for step in range(14)])  # 42 = 6 epochs.
  for epoch in range(6):
    chunk = stream[epoch * num_items:(epoch + 1) * num_items]
    assert sorted(chunk.tolist()) == list(range(num_items))
  # Epochs are different permutations, and the order is not the identity.
  assert not np.array_equal(stream[:7], stream[7:14])


@pytest.mark.parametrize("num_items,batch", [(10, 4), (7, 3), (5, 5),
                                             (3, 8)])
def test_batch_step_is_the_slice_of_the_seeded_stream(num_items, batch):
  # Batch s is positions [s·b, (s+1)·b) of the stream, batches that straddle
  # an epoch boundary (and batches wider than an epoch) included.
  seed, steps = 3, 9
  stream = _stream(num_items, seed, -(-steps * batch // num_items) + 1)
  for step in range(steps):
    np.testing.assert_array_equal(
        order.epoch_order(num_items, batch, seed, step),
        stream[step * batch:(step + 1) * batch], err_msg=f"step {step}")


def test_a_batch_depends_only_on_seed_and_step():
  # Any step can be computed first (a resumed run starts mid-stream).
  late = order.epoch_order(10, 4, 3, 7)
  np.testing.assert_array_equal(late, _stream(10, 3, 4)[28:32])
  assert not np.array_equal(order.epoch_order(100, 8, 0, 2),
                            order.epoch_order(100, 8, 1, 2))
  assert not np.array_equal(order.epoch_order(100, 8, 0, 2),
                            order.epoch_order(100, 8, 0, 3))


def test_bad_sizes_are_rejected():
  with pytest.raises(ValueError, match="num_items"):
    order.epoch_order(0, 4, 0, 0)
