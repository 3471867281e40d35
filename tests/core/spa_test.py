"""SPA (core/spa.py): sum-to-outcome loss and fused turn advantages by hand."""

import functools

import jax
import numpy as np
import pytest

from rl_rewards import core
from rl_rewards.core import spa

# One group of two episodes, S = 3 turn slots. Row 1 has two turns: its
# third slot is padding, filled with a value that must count nowhere.
C = np.array([[0.2, 0.3, 0.4], [0.5, -0.1, 9.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)
R = np.array([1.0, 0.0], np.float32)
G = np.array([[1, 0, 1], [0, 1, 1]], np.float32)


def test_progress_loss_by_hand():
  # Σĉ = 0.9 vs R = 1 and Σĉ = 0.4 vs R = 0: errors 0.01 and 0.16.
  np.testing.assert_allclose(spa.progress_row_losses(C, MASK, R),
                             [0.01, 0.16], atol=1e-6)
  np.testing.assert_allclose(spa.progress_loss(C, MASK, R), 0.085, atol=1e-6)
  # A row without turns adds nothing and is not counted in the mean.
  c3 = np.concatenate([C, [[5.0, 5.0, 5.0]]])
  m3 = np.concatenate([MASK, [[0, 0, 0]]]).astype(bool)
  r3 = np.concatenate([R, [3.0]]).astype(np.float32)
  np.testing.assert_allclose(spa.progress_loss(c3, m3, r3), 0.085, atol=1e-6)
  # No turn anywhere: 0, not NaN.
  assert float(spa.progress_loss(C, np.zeros_like(MASK), R)) == 0.0


def test_turn_end_values_read_the_last_token_of_each_turn():
  ids = np.array([[-1, 0, 0, -1, 1, 1, -1]], np.int32)
  x = np.array([[9, 1, 2, 8, 3, 4, 7]], np.float32)
  np.testing.assert_allclose(spa.turn_end_values(x, ids, 2), [[2, 4]])
  # Turns merged into one slot (ids clamped to S = 1) sum their ends, so
  # the row's total contribution is unchanged.
  merged = np.where(ids > 0, 0, ids)
  np.testing.assert_allclose(spa.turn_end_values(x, merged, 1), [[6]])


def test_fused_advantages_by_hand_drgrpo():
  # r = ĉ + 0.5·g: [0.7, 0.3, 0.9] and [0.5, 0.4]; returns-to-go
  # [1.9, 1.2, 0.9] and [0.9, 0.4]; baseline mean(1.9, 0.9) = 1.4.
  a, g = spa.spa_turn_advantages(C, MASK, R, 2, G, alpha=1.0, beta=0.5)
  np.testing.assert_allclose(g, [[1.9, 1.2, 0.9], [0.9, 0.4, 0]], atol=1e-6)
  np.testing.assert_allclose(a, [[0.5, -0.2, -0.5], [-0.5, -1.0, 0]],
                             atol=1e-6)


def test_fused_advantages_by_hand_rloo_and_outcome_term():
  # rloo: each episode's baseline is the other's return (0.9 and 1.9).
  a, _ = spa.spa_turn_advantages(C, MASK, R, 2, G, alpha=1.0, beta=0.5,
                                 baseline="rloo")
  np.testing.assert_allclose(a, [[1.0, 0.3, 0.0], [-1.0, -1.5, 0]],
                             atol=1e-6)
  # η = 1, β = 0, α = 2: G = R + 2·Σ_{j≥k} ĉ_j = [2.8, 2.4, 1.8] and
  # [0.8, −0.2]; baseline mean(2.8, 0.8) = 1.8.
  a, g = spa.spa_turn_advantages(C, MASK, R, 2, None, alpha=2.0, beta=0.0,
                                 outcome_coef=1.0)
  np.testing.assert_allclose(g, [[2.8, 2.4, 1.8], [0.8, -0.2, 0]], atol=1e-6)
  np.testing.assert_allclose(a, [[1.0, 0.6, 0.0], [-1.0, -2.0, 0]],
                             atol=1e-6)
  # No grounding array means every turn is grounded.
  a1, _ = spa.spa_turn_advantages(C, MASK, R, 2, None, beta=0.5)
  a2, _ = spa.spa_turn_advantages(C, MASK, R, 2, np.ones_like(G), beta=0.5)
  np.testing.assert_allclose(a1, a2)


def test_padded_turns_count_nowhere():
  want, _ = spa.spa_turn_advantages(C, MASK, R, 2, G, beta=0.5)
  c, g = C.copy(), G.copy()
  c[1, 2], g[1, 2] = -40.0, 0.0
  got, _ = spa.spa_turn_advantages(c, MASK, R, 2, g, beta=0.5)
  np.testing.assert_allclose(got, want, atol=1e-6)
  # An extra all-padding slot changes nothing either.
  pad = lambda x, v: np.concatenate([x, np.full((2, 1), v, x.dtype)], 1)
  got, _ = spa.spa_turn_advantages(pad(C, 7.0), pad(MASK, False), R, 2,
                                   pad(G, 1.0), beta=0.5)
  np.testing.assert_allclose(got[:, :3], want, atol=1e-6)
  np.testing.assert_array_equal(got[:, 3], 0.0)
  np.testing.assert_allclose(
      spa.progress_loss(pad(C, 7.0), pad(MASK, False), R), 0.085, atol=1e-6)


def test_jit_matches_eager():
  fn = functools.partial(spa.spa_turn_advantages, group_size=2, alpha=1.0,
                         beta=0.5, outcome_coef=0.5, baseline="rloo")
  eager = fn(C, MASK, R, grounding=G)
  jitted = jax.jit(fn)(C, MASK, R, grounding=G)
  for x, y in zip(eager, jitted):
    np.testing.assert_allclose(x, y, atol=1e-6)
  np.testing.assert_allclose(jax.jit(spa.progress_loss)(C, MASK, R),
                             spa.progress_loss(C, MASK, R), atol=1e-7)


def test_a_perfect_attribution_with_no_grounding_is_the_outcome_advantage():
  # Σ_k ĉ = R for every episode: the first turn's advantage is Dr. GRPO's
  # R − mean(R).
  c = np.array([[0.5, 0.25, 0.25], [0.5, -0.5, 0.0]], np.float32)
  a, _ = spa.spa_turn_advantages(c, MASK, R, 2, beta=0.0)
  np.testing.assert_allclose(
      a[:, 0], core.group_advantages(R, 2, estimator="drgrpo"), atol=1e-6)


def test_bad_inputs_are_refused():
  with pytest.raises(ValueError, match="baseline"):
    spa.spa_turn_advantages(C, MASK, R, 2, baseline="grpo")
  with pytest.raises(ValueError, match="turn_mask"):
    spa.progress_loss(C, MASK[:, :2], R)
