"""IGPO's turn rewards, group normalisation and discounted sums by hand."""

import functools

import jax
import numpy as np
import pytest

from rl_rewards import core
from rl_rewards.core import igpo

# One group of two episodes. Row 0: three turns; row 1: two turns (its third
# slot is padding). P after each prefix (prompt, before turn 1, before turn
# 2, after the end): the entries past a row's last turn are never read.
P = np.array([[0.2, 0.5, 0.4, 0.9],
              [0.2, 0.6, 0.7, 0.1]])
TURNS = np.array([[1, 1, 1], [1, 1, 0]], bool)
OUTCOME = np.array([1.0, 0.0])
# r = P_{k+1} − P_k before the last turn, the outcome on it.
R = np.array([[0.3, -0.1, 1.0], [0.4, 0.0, 0.0]])


def _zscore(values):
  """The code's group z-score: population std under sqrt(var + 1e-8)."""
  values = np.asarray(values, np.float64)
  if values.size <= 1:
    return values - values.mean()
  std = np.sqrt(values.var() + 1e-8)
  return (values - values.mean()) / (std + 1e-6)


def test_rewards_are_gains_of_the_answer_probability_then_the_outcome():
  r = igpo.information_gain_rewards(np.log(P), OUTCOME, TURNS)
  np.testing.assert_allclose(r, R, atol=1e-6)
  # A turn that lowers P(answer) is paid a negative reward.
  assert float(r[0, 1]) < 0


def test_joint_normalisation_pools_gains_and_outcomes_of_the_group():
  r = igpo.information_gain_rewards(np.log(P), OUTCOME, TURNS)
  z = igpo.igpo_normalize(r, TURNS, 2, norm="joint")
  # Entries 0.3, −0.1, 1, 0.4, 0: mean 0.32, population var 0.1496.
  mean, std = 0.32, np.sqrt(0.1496 + 1e-8)
  want = np.array([[0.3, -0.1, 1.0], [0.4, 0.0, 0.0]])
  want = np.where(TURNS, (want - mean) / (std + 1e-6), 0.0)
  np.testing.assert_allclose(z, want, atol=1e-5)
  np.testing.assert_allclose(z[TURNS], _zscore([0.3, -0.1, 1.0, 0.4, 0.0]),
                             atol=1e-5)


def test_separate_normalisation_has_one_scale_for_outcomes_and_one_for_gains():
  r = igpo.information_gain_rewards(np.log(P), OUTCOME, TURNS)
  z = np.asarray(igpo.igpo_normalize(r, TURNS, 2, norm="separate"))
  # Outcomes 1, 0: mean 0.5, std 0.5 -> ±1. Gains 0.3, −0.1, 0.4: mean
  # 0.2, population var 0.14 / 3.
  np.testing.assert_allclose([z[0, 2], z[1, 1]], [1.0, -1.0], atol=1e-5)
  std = np.sqrt(0.14 / 3 + 1e-8) + 1e-6
  np.testing.assert_allclose([z[0, 0], z[0, 1], z[1, 0]],
                             [0.1 / std, -0.3 / std, 0.2 / std], atol=1e-5)
  assert z[1, 2] == 0.0


@pytest.mark.parametrize("jit", [False, True])
def test_advantages_are_discounted_sums_of_normalised_rewards(jit):
  fn = functools.partial(core.igpo_advantages, group_size=2, gamma=0.5,
                         norm="joint")
  if jit:
    fn = jax.jit(fn)
  a = np.asarray(fn(np.log(P), OUTCOME, TURNS))
  z = np.zeros((2, 3))
  z[TURNS] = _zscore([0.3, -0.1, 1.0, 0.4, 0.0])
  want = np.array([[z[0, 0] + 0.5 * z[0, 1] + 0.25 * z[0, 2],
                    z[0, 1] + 0.5 * z[0, 2], z[0, 2]],
                   [z[1, 0] + 0.5 * z[1, 1], z[1, 1], 0.0]])
  np.testing.assert_allclose(a, want, atol=1e-5)
  # γ = 1: the plain sum from each turn on.
  a1 = np.asarray(core.igpo_advantages(np.log(P), OUTCOME, TURNS, 2,
                                       gamma=1.0))
  np.testing.assert_allclose(a1[0], [z[0].sum(), z[0, 1:].sum(), z[0, 2]],
                             atol=1e-5)


def test_extra_padded_turns_change_nothing():
  rng = np.random.default_rng(0)
  base = np.asarray(core.igpo_advantages(np.log(P), OUTCOME, TURNS, 2,
                                         gamma=0.7, norm="separate"))
  wide_p = np.concatenate([np.log(P), rng.normal(size=(2, 3))], axis=1)
  wide_turns = np.concatenate([TURNS, np.zeros((2, 3), bool)], axis=1)
  wide = np.asarray(core.igpo_advantages(wide_p, OUTCOME, wide_turns, 2,
                                         gamma=0.7, norm="separate"))
  np.testing.assert_allclose(wide[:, :3], base, atol=1e-6)
  np.testing.assert_array_equal(wide[:, 3:], 0.0)


def test_groups_are_normalised_apart_and_single_entries_are_centred():
  # Two groups of one row: row 0's three turns are z-scored alone; row 1
  # (one turn: its outcome) has a single entry, so it is centred to 0.
  p = np.log(np.array([[0.1, 0.3, 0.6, 0.0 + 1.0], [0.5, 0.5, 0.5, 0.5]]))
  turns = np.array([[1, 1, 1], [1, 0, 0]], bool)
  a = np.asarray(core.igpo_advantages(p, np.array([1.0, 1.0]), turns, 1,
                                      gamma=1.0))
  z = _zscore([0.2, 0.3, 1.0])
  np.testing.assert_allclose(a[0], [z.sum(), z[1:].sum(), z[2]], atol=1e-5)
  np.testing.assert_allclose(a[1], 0.0, atol=1e-6)
  assert np.isfinite(a).all()


def test_identical_episodes_differ_only_between_their_turns():
  # Four copies of (gain 0.2, outcome 1). Separate: each set has zero
  # variance, so every advantage is 0. Joint: the pooled entries 0.2 and 1
  # (mean 0.6, std 0.4) normalise to −1 and +1: A = (−1 + 1, 1).
  p = np.log(np.tile([[0.3, 0.5, 0.5]], (4, 1)))
  turns = np.ones((4, 2), bool)
  a = np.asarray(core.igpo_advantages(p, np.ones(4), turns, 4,
                                      norm="separate"))
  np.testing.assert_allclose(a, 0.0, atol=1e-6)
  a = np.asarray(core.igpo_advantages(p, np.ones(4), turns, 4, norm="joint"))
  np.testing.assert_allclose(a, np.tile([[0.0, 1.0]], (4, 1)), atol=1e-4)


def test_bad_shapes_and_norm_are_refused():
  with pytest.raises(ValueError, match="S\\+1"):
    igpo.information_gain_rewards(np.zeros((2, 3)), OUTCOME, TURNS)
  with pytest.raises(ValueError, match="norm"):
    igpo.igpo_normalize(R, TURNS, 2, norm="pooled")
