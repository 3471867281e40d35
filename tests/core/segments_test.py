"""Tests for rl_rewards.core.segments."""

import jax
import numpy as np
import pytest

from rl_rewards.core import segments
from . import core_reference

_JIT_IDS = jax.jit(segments.step_ids_from_step_ends)
_JIT_TO_STEPS = jax.jit(segments.tokens_to_steps, static_argnums=(2, 3))
_JIT_TO_TOKENS = jax.jit(segments.steps_to_tokens)
_JIT_END_TOKENS = jax.jit(segments.steps_to_end_tokens)
_JIT_ENDS = jax.jit(segments.step_end_mask_from_ids)
_JIT_STEP_MASK = jax.jit(segments.step_mask_from_ids, static_argnums=1)


def test_step_ids_hand_computed_jit_and_eager():
  # Prompt (2 tokens) | "a a SEP a EOS" | padding. The separator at t=4 ends
  # step 0; the last valid token t=6 ends step 1; the flag at t=7 (padding)
  # and on the prompt are ignored.
  mask = np.array([[0, 0, 1, 1, 1, 1, 1, 0]])
  ends = np.array([[1, 0, 0, 0, 1, 0, 0, 1]])
  for fn in (segments.step_ids_from_step_ends, _JIT_IDS):
    np.testing.assert_array_equal(fn(ends, mask),
                                  [[-1, -1, 0, 0, 0, 1, 1, -1]])
  ids = np.array([[-1, -1, 0, 0, 0, 1, 1, -1]])
  x = np.arange(8, dtype=np.float32)[None]
  np.testing.assert_allclose(segments.tokens_to_steps(x, ids, 3, "sum"),
                             [[9, 11, 0]])
  np.testing.assert_allclose(_JIT_TO_STEPS(x, ids, 3, "sum"), [[9, 11, 0]])
  np.testing.assert_allclose(_JIT_TO_STEPS(x, ids, 3, "last"), [[4, 6, 0]])
  np.testing.assert_allclose(_JIT_TO_STEPS(x, ids, 3, "mean"), [[3, 5.5, 0]])
  np.testing.assert_allclose(_JIT_TO_TOKENS(np.array([[10., 20., 30.]]), ids),
                             [[0, 0, 10, 10, 10, 20, 20, 0]])


def test_no_delimiter_is_one_step_and_empty_row_has_none():
  mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0]])
  ids = _JIT_IDS(np.zeros_like(mask), mask)
  np.testing.assert_array_equal(ids, [[0, 0, 0, -1], [-1, -1, -1, -1]])
  np.testing.assert_array_equal(segments.num_steps_per_row(ids), [1, 0])
  np.testing.assert_array_equal(segments.last_valid_index(mask), [2, -1])


def test_consecutive_delimiters_make_delimiter_only_steps():
  mask = np.ones((1, 5))
  ends = np.array([[0, 1, 1, 0, 0]])
  ids = _JIT_IDS(ends, mask)
  np.testing.assert_array_equal(ids, [[0, 0, 1, 2, 2]])
  np.testing.assert_array_equal(segments.step_token_counts(ids, 4),
                                [[2, 1, 2, 0]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_matches_reference(seed):
  batch = core_reference.random_batch(seed)
  b_size, length = batch["mask"].shape
  s = batch["num_steps"]
  ids = np.asarray(_JIT_IDS(batch["ends"], batch["mask"]))
  np.testing.assert_array_equal(ids, batch["ids"])
  np.testing.assert_array_equal(
      _JIT_STEP_MASK(ids, s), core_reference.step_mask_reference(ids, s))
  ends = np.asarray(_JIT_ENDS(ids))
  x = batch["values"]
  sums, counts, last = (np.zeros((b_size, s)) for _ in range(3))
  for b in range(b_size):
    for t in range(length):
      if ids[b, t] >= 0:
        sums[b, ids[b, t]] += x[b, t]
        counts[b, ids[b, t]] += 1
        last[b, ids[b, t]] = x[b, t]  # Later tokens overwrite earlier ones.
        assert ends[b, t] == (t == length - 1 or ids[b, t + 1] != ids[b, t])
  mean = np.where(counts > 0, sums / np.maximum(counts, 1), 0)
  for reduce, expected in (("sum", sums), ("last", last), ("mean", mean)):
    np.testing.assert_allclose(_JIT_TO_STEPS(x, ids, s, reduce), expected,
                               rtol=1e-5, atol=1e-6)
  step_values = np.arange(b_size * s, dtype=np.float32).reshape(b_size, s)
  tokens = np.asarray(_JIT_TO_TOKENS(step_values + 1, ids))
  for b in range(b_size):
    for t in range(length):
      expected = step_values[b, ids[b, t]] + 1 if ids[b, t] >= 0 else 0
      assert tokens[b, t] == expected
  np.testing.assert_array_equal(_JIT_END_TOKENS(step_values + 1, ids),
                                np.where(ends, tokens, 0))


def test_padding_invariance():
  batch = core_reference.random_batch(5, length=8)
  mask = np.pad(batch["mask"], ((0, 0), (0, 4)))
  ends = np.pad(batch["ends"], ((0, 0), (0, 4)), constant_values=1)
  ids = np.asarray(_JIT_IDS(ends, mask))
  np.testing.assert_array_equal(ids[:, :-4], batch["ids"])
  np.testing.assert_array_equal(ids[:, -4:], -1)
  x = np.pad(batch["values"], ((0, 0), (0, 4)), constant_values=9.0)
  padded = np.asarray(_JIT_TO_STEPS(x, ids, 12, "sum"))
  x_small = np.pad(batch["values"], ((0, 0), (0, 4)))
  ids_small = np.pad(batch["ids"], ((0, 0), (0, 4)), constant_values=-1)
  np.testing.assert_allclose(padded, _JIT_TO_STEPS(x_small, ids_small, 12,
                                                   "sum"), rtol=1e-6)
  np.testing.assert_allclose(padded[:, 8:], 0.0)


def test_outcome_and_broadcast():
  mask = np.array([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
  scores = np.array([2.0, -1.0, 5.0], np.float32)
  np.testing.assert_allclose(
      segments.outcome_token_rewards(scores, mask),
      [[0, 0, 2, 0], [0, 0, 0, -1], [0, 0, 0, 0]])
  np.testing.assert_allclose(
      segments.broadcast_to_tokens(scores, mask),
      [[0, 2, 2, 0], [-1, -1, -1, -1], [0, 0, 0, 0]])


def test_out_of_range_ids_give_zero():
  out = _JIT_TO_TOKENS(np.ones((1, 2)), np.array([[0, 1, 2, -1]]))
  np.testing.assert_allclose(out, [[1, 1, 0, 0]])


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="reduce"):
    segments.tokens_to_steps(np.ones((1, 3)), np.zeros((1, 3), int), 2,
                             "median")
  with pytest.raises(ValueError, match="integer"):
    segments.steps_to_tokens(np.ones((1, 2)), np.zeros((1, 3)))
  with pytest.raises(ValueError, match="num_steps"):
    segments.tokens_to_steps(np.ones((1, 3)), np.zeros((1, 3), int), 0)
  with pytest.raises(ValueError, match="shapes must match"):
    segments.step_ids_from_step_ends(np.ones((1, 3)), np.ones((1, 4)))
