"""The order in which a fixed training set is visited, resumable by step."""

import numpy as np


def epoch_order(num_items: int, batch_size: int, seed: int,
                step: int) -> np.ndarray:
  """Item indices of training batch `step` over a set of `num_items`.

  Batch `step` covers positions [step·batch_size, (step+1)·batch_size) of an
  endless stream in which epoch e is a permutation of the items seeded by
  (seed, e). The batch of any step is a pure function of (seed, step), so a
  resumed run sees exactly the batches an uninterrupted one would.

  Args:
    num_items: size of the training set (>= 1).
    batch_size: items per batch (>= 1).
    seed: the run's data seed.
    step: 0-based batch index.

  Returns:
    [batch_size] int64 item indices.
  """
  if num_items < 1 or batch_size < 1:
    raise ValueError(f"need num_items >= 1 and batch_size >= 1, got "
                     f"{num_items} and {batch_size}.")
  positions = np.arange(step * batch_size, (step + 1) * batch_size)
  out = np.empty_like(positions)
  for epoch in np.unique(positions // num_items):
    perm = np.random.default_rng([seed, int(epoch)]).permutation(num_items)
    selected = positions // num_items == epoch
    out[selected] = perm[positions[selected] % num_items]
  return out
