"""Refreshing a Q^π verifier on the RL policy's rollouts."""

import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards.runners import verifier_refresh
from rl_rewards.runners.methods import base


def test_refresh_batch_targets_every_step_with_the_outcome():
  step_ids = jnp.array([[-1, 0, 0, 1, 1, -1],    # 2 steps, right
                        [-1, 0, 1, 2, -1, -1],   # 3 steps, wrong
                        [-1, 0, 0, 0, -1, -1]])  # filtered out
  batch = {"tokens": jnp.zeros((3, 6), jnp.int32),
           "attention_mask": jnp.ones((3, 6), jnp.int32),
           "response_mask": jnp.array([[0, 1, 1, 1, 1, 0],
                                       [0, 1, 1, 1, 0, 0],
                                       [0, 0, 0, 0, 0, 0]], jnp.float32),
           "step_ids": step_ids,
           "rewards": jnp.array([1.0, 0.0, 1.0])}
  got = verifier_refresh.refresh_batch(batch, num_steps=4)
  np.testing.assert_array_equal(got["targets"], [[1, 1, 1, 1], [0, 0, 0, 0],
                                                 [1, 1, 1, 1]])
  np.testing.assert_array_equal(got["target_mask"], [[1, 1, 0, 0],
                                                     [1, 1, 1, 0],
                                                     [0, 0, 0, 0]])
  np.testing.assert_array_equal(got["v_target"], [1, 0, 1])
  np.testing.assert_array_equal(got["v_mask"], [1, 1, 0])
  assert got["step_ids"] is step_ids


@pytest.mark.parametrize("model,target", [("head", "hard"),
                                          ("generative", "progress"),
                                          ("head", "prover"),
                                          ("implicit", "outcome")])
def test_only_q_pi_verifiers_are_refreshed(model, target):
  config = config_lib.base_config()
  verifier_refresh.check(config, base.Verifier(None, "head", "soft"))
  verifier_refresh.check(config, base.Verifier(None, "generative", "soft"))
  with pytest.raises(config_lib.ConfigError,
                     match="rl.verifier_refresh_lr.*Q\\^π"):
    verifier_refresh.check(config, base.Verifier(None, model, target))
  with pytest.raises(config_lib.ConfigError, match="reads none"):
    verifier_refresh.check(config, None)
