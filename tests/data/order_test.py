"""The resumable visiting order of a fixed training set."""

import numpy as np
import pytest

from rl_rewards.data import order


def test_every_epoch_visits_each_item_once():
  num_items, batch = 7, 3
  stream = np.concatenate([order.epoch_order(num_items, batch, 5, step)
                           for step in range(14)])  # 42 = 6 epochs.
  for epoch in range(6):
    chunk = stream[epoch * num_items:(epoch + 1) * num_items]
    assert sorted(chunk.tolist()) == list(range(num_items))
  # Epochs are different permutations, and the order is not the identity.
  assert not np.array_equal(stream[:7], stream[7:14])


def test_a_batch_depends_only_on_seed_and_step():
  np.testing.assert_array_equal(order.epoch_order(10, 4, 3, 7),
                                order.epoch_order(10, 4, 3, 7))
  assert not np.array_equal(order.epoch_order(100, 8, 0, 2),
                            order.epoch_order(100, 8, 1, 2))


def test_bad_sizes_are_rejected():
  with pytest.raises(ValueError, match="num_items"):
    order.epoch_order(0, 4, 0, 0)
