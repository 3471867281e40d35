"""Reads back the advantages a method computes inside the RL loop."""

import jax
import numpy as np

from rl_rewards.runners import methods


def spy_on_advantages(monkeypatch, method_name):
  """Records (batch, advantages) of every RL step as host arrays: the list
  fills as the loop runs."""
  seen = []
  cls = methods.METHODS[method_name]
  advantages = cls.advantages

  def spy(self, batch):  # Runs under jit: read the values back on the host.
    out = advantages(self, batch)
    jax.debug.callback(
        lambda b, a: seen.append(({k: np.asarray(v) for k, v in b.items()},
                                  np.asarray(a))), dict(batch), out[0])
    return out

  monkeypatch.setattr(cls, "advantages", spy)
  return seen
