"""Tests for rl_rewards.core.critiques (CAPO token rewards, FAPO)."""

import jax
import numpy as np
import pytest

from rl_rewards.core import critiques

_JIT_VOTE = jax.jit(critiques.vote_wrong_steps, static_argnames=("voting",))
_JIT_CAPO = jax.jit(critiques.capo_token_rewards)
_JIT_FAPO = jax.jit(critiques.fapo_rewards)

# One response, three critiques, three steps. Votes per step: 2, 1, 3.
_FLAGS = np.array([[[1, 0, 1], [1, 1, 1], [0, 0, 1]]], bool)


@pytest.mark.parametrize("voting,expected", [
    ("majority", [1, 0, 1]),
    ("intersection", [0, 0, 1]),
    ("average", [2 / 3, 1 / 3, 1]),
])
def test_vote_hand_computed(voting, expected):
  np.testing.assert_allclose(_JIT_VOTE(_FLAGS, voting=voting)[0], expected,
                             rtol=1e-6)


def test_vote_ignores_failed_critiques():
  # The second critique failed to parse: votes 1, 0, 2 of C = 2. Majority
  # needs > 1 vote (a ">= half" rule would flag step 0 too); intersection
  # needs 2 of 2.
  mask = np.array([[1, 0, 1]])
  np.testing.assert_allclose(_JIT_VOTE(_FLAGS, mask)[0], [0, 0, 1])
  np.testing.assert_allclose(
      _JIT_VOTE(_FLAGS, mask, voting="intersection")[0], [0, 0, 1])
  np.testing.assert_allclose(_JIT_VOTE(_FLAGS, mask, voting="average")[0],
                             [0.5, 0.0, 1.0])
  # No valid critique: no penalty under every rule.
  none = np.zeros((1, 3))
  for voting in critiques.VOTING_RULES:
    np.testing.assert_array_equal(_JIT_VOTE(_FLAGS, none, voting=voting),
                                  np.zeros((1, 3)))


def _capo_reference(outcome, wrong, ids, mask, w_whole, w_process):
  out = np.zeros(ids.shape)
  for b in range(ids.shape[0]):
    for t in range(ids.shape[1]):
      if mask[b, t]:
        k = ids[b, t]
        pen = wrong[b, k] if 0 <= k < wrong.shape[1] else 0.0
        out[b, t] = w_whole * outcome[b] - w_process * pen
  return out


def test_capo_hand_computed():
  # Row 0 correct, steps [wrong, ok, wrong]: tokens get 2·1 − 1·e:
  #   prompt, s0, s0, s1, s2, pad -> [0, 1, 1, 2, 1, 0].
  # Row 1 wrong, step 1 wrong: [0 − 0, 0 − 1] per step.
  # Catches: penalty on the step after the wrong one (off by one), the
  # penalty added instead of subtracted, the outcome unweighted.
  ids = np.array([[-1, 0, 0, 1, 2, -1], [0, 1, 1, -1, -1, -1]])
  mask = ids >= 0
  wrong = np.array([[1, 0, 1], [0, 1, 1]], np.float32)
  out = _JIT_CAPO(np.array([1, 0]), wrong, ids, mask, w_whole=2.0,
                  w_process=1.0)
  np.testing.assert_allclose(out, [[0, 1, 1, 2, 1, 0], [0, -1, -1, 0, 0, 0]])


def test_capo_matches_reference_padding_and_eager():
  rng = np.random.default_rng(0)
  counts = rng.integers(1, 5, 6)
  lengths = counts + rng.integers(0, 6, 6)
  ids = np.full((6, 12), -1)
  for b in range(6):
    ids[b, 1:1 + lengths[b]] = np.sort(np.concatenate(
        [np.arange(counts[b]), rng.integers(0, counts[b],
                                            lengths[b] - counts[b])]))
  mask = ids >= 0
  wrong = rng.random((6, 5)).astype(np.float32)
  outcome = rng.integers(0, 2, 6)
  out = np.asarray(_JIT_CAPO(outcome, wrong, ids, mask, w_whole=1.5,
                             w_process=0.5))
  np.testing.assert_allclose(
      out, _capo_reference(outcome, wrong, ids, mask, 1.5, 0.5), rtol=1e-6)
  # Extra padded tokens (junk ids under a zero mask) and extra steps.
  pad_ids = np.pad(ids, ((0, 0), (0, 4)), constant_values=3)
  padded = _JIT_CAPO(outcome, np.pad(wrong, ((0, 0), (0, 2)),
                                     constant_values=9.0),
                     pad_ids, np.pad(mask, ((0, 0), (0, 4))), w_whole=1.5,
                     w_process=0.5)
  np.testing.assert_allclose(np.asarray(padded)[:, :12], out, rtol=1e-6)
  assert not np.asarray(padded)[:, 12:].any()
  eager = critiques.capo_token_rewards(outcome, wrong, ids, mask,
                                       w_whole=1.5, w_process=0.5)
  np.testing.assert_allclose(eager, out, rtol=1e-6)


def test_fapo_hand_computed():
  # Code: ±1, a flawed positive scores 0. A flawed *wrong* answer is not
  # penalised further (a bug penalising it gives −2).
  correct = np.array([1, 1, 0, 0])
  flawed = np.array([0, 1, 1, 0])
  np.testing.assert_allclose(_JIT_FAPO(correct, flawed), [1, 0, -1, -1])
  np.testing.assert_allclose(
      critiques.fapo_rewards(correct, flawed, penalty=0.5,
                             incorrect_reward=0.0), [1, 0.5, 0, 0])


def test_sampled_critiques_mark_a_step_wrong_with_one_minus_its_score():
  scores = np.array([[0.0, 1.0, 0.3, 0.9]], np.float32)
  mask = np.array([[1, 1, 1, 0]])
  flags = np.asarray(jax.jit(critiques.sample_critiques,
                             static_argnames=("num_critiques",))(
                                 jax.random.key(0), scores, mask,
                                 num_critiques=4000))
  assert flags.shape == (1, 4000, 4)
  assert flags[0, :, 0].all() and not flags[0, :, 1].any()  # Certain.
  # Wrong with probability 1 − 0.3 = 0.7 (a swapped rule gives 0.3);
  # 4000 draws: standard error 0.007.
  assert abs(flags[0, :, 2].mean() - 0.7) < 0.03
  assert not flags[0, :, 3].any()  # Off the response's steps.
  # Majority of 5 sampled critiques of a 0.3 step: P(≥ 3 wrong of 5) at
  # p = 0.7 is 0.837 (one critique: 0.7).
  five = critiques.sample_critiques(jax.random.key(1),
                                    np.full((4000, 1), 0.3, np.float32),
                                    np.ones((4000, 1)), num_critiques=5)
  voted = np.asarray(critiques.vote_wrong_steps(five, voting="majority"))
  assert abs(voted.mean() - 0.837) < 0.03
  with pytest.raises(ValueError, match="num_critiques"):
    critiques.sample_critiques(jax.random.key(0), scores, mask, 0)


def test_rejects_bad_arguments():
  with pytest.raises(ValueError, match="voting"):
    critiques.vote_wrong_steps(_FLAGS, voting="mean")
  with pytest.raises(ValueError, match="step_flags"):
    critiques.vote_wrong_steps(_FLAGS[0])
  with pytest.raises(ValueError, match="flawed"):
    critiques.fapo_rewards(np.ones(3), np.ones(2))


def test_all_padding_row_is_zero():
  ids = np.array([[0, 1, -1], [-1, -1, -1]])
  out = _JIT_CAPO(np.array([1, 1]), np.ones((2, 2), np.float32), ids,
                  ids >= 0, w_whole=2.0, w_process=1.0)
  np.testing.assert_allclose(out, [[1, 1, 0], [0, 0, 0]])
