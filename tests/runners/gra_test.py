"""G-RA (runners/methods/gra.py): gated returns by hand."""

import numpy as np

from rl_rewards import config_lib
from rl_rewards.runners import methods

# Two episodes of one group, P = 1 prompt slot. Row 0: three turns with an
# observation (−1) after turn 0 and between turns 1 and 2; row 1: two turns.
STEP_IDS = np.array([[-1, 0, 0, -1, 1, -1, 2, 2],
                     [-1, 0, -1, -1, 1, 1, -1, -1]], np.int32)


def _advantages(threshold, beta, rewards):
  config = config_lib.base_config()
  config.rl.method = "gra"
  config.rl.advantage_estimator = "drgrpo"
  config.rl.group_size = 2
  config.rl.gra.threshold = threshold
  config.rl.gra.turn_reward = beta
  method = methods.make(config)
  method.check()
  batch = {"rewards": np.array(rewards, np.float32),
           "step_scores": np.array([[1, 0, 1], [1, 1, 0]], np.float32),
           "step_ids": STEP_IDS,
           "response_mask": (STEP_IDS >= 0).astype(np.int32)}
  a, parts = method.advantages(batch)
  return np.asarray(a), {k: np.asarray(v) for k, v in parts.items()}


def test_turn_rewards_count_only_in_episodes_that_pass_the_gate():
  # Row 0 is right (r = 1 >= Δ = 1): G = 1 + 0.5·(1 + 0 + 1) = 2 from turn
  # 0, 1 + 0.5·(0 + 1) = 1.5 from turns 1 and 2. Row 1 is wrong: its two
  # progressing turns earn nothing, G = 0. Baseline: mean(2, 0) = 1.
  a, parts = _advantages(1.0, 0.5, [1.0, 0.0])
  want = np.array([[0, 1, 1, 0, .5, 0, .5, .5],
                   [0, -1, 0, 0, -1, -1, 0, 0]])
  np.testing.assert_allclose(a, want, atol=1e-6)
  # The outcome part is Dr. GRPO's r − mean(r) = ±0.5 on policy tokens.
  np.testing.assert_allclose(parts["outcome"],
                             0.5 * np.array([[1], [-1]]) * (STEP_IDS >= 0))


def test_a_closed_gate_is_outcome_only_drgrpo():
  # Δ = 2 above every reward: G = r on every turn, baseline 0.5.
  a, parts = _advantages(2.0, 0.5, [1.0, 0.0])
  np.testing.assert_allclose(a, parts["outcome"], atol=1e-6)
  np.testing.assert_allclose(parts["process"], 0.0, atol=1e-6)
  # So is β = 0 with the gate open.
  a0, parts0 = _advantages(1.0, 0.0, [1.0, 0.0])
  np.testing.assert_allclose(a0, parts0["outcome"], atol=1e-6)
