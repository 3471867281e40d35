"""Tests for rl_rewards.core.masking."""

import jax
import numpy as np
import pytest

from rl_rewards.core import masking
from . import core_reference

_JIT_WHITEN = jax.jit(masking.masked_whiten)
_JIT_MEAN = jax.jit(masking.masked_mean)


@pytest.mark.parametrize("whiten", [masking.masked_whiten, _JIT_WHITEN])
def test_whiten_hand_computed_tv1(whiten):
  # TV-1: GAE advantages [0.456725, 0.3755, 0.29, 0.2], mean 0.3305563,
  # unbiased variance; whitened values from the spec.
  adv = np.array([[0.456725, 0.3755, 0.29, 0.2]], np.float32)
  out = whiten(adv, np.ones_like(adv))
  np.testing.assert_allclose(
      out, [[1.141837, 0.406745, -0.367037, -1.181545]], atol=2e-6)


def test_whiten_tv4_masked_entry_is_zero():
  # TV-4: returns over 5 valid tokens; the padded entry stays 0.
  returns = np.array([[0.96, 0.97, 0.99], [-0.04, -0.01, 0.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0]])
  np.testing.assert_allclose(
      masking.masked_whiten(returns, mask),
      [[0.705643, 0.723923, 0.760485], [-1.122447, -1.067604, 0.0]],
      atol=2e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference_random(seed):
  batch = core_reference.random_batch(seed)
  x, mask = batch["values"], batch["mask"]
  np.testing.assert_allclose(_JIT_WHITEN(x, mask),
                             core_reference.whiten_reference(x, mask),
                             rtol=1e-5, atol=1e-5)
  valid = x[mask.astype(bool)]
  np.testing.assert_allclose(_JIT_MEAN(x, mask), valid.mean(), rtol=1e-5)
  np.testing.assert_allclose(masking.masked_var(x, mask), valid.var(ddof=1),
                             rtol=1e-5)
  np.testing.assert_allclose(masking.masked_var(x, mask, unbiased=False),
                             valid.var(), rtol=1e-5)
  np.testing.assert_allclose(masking.masked_sum(x, mask), valid.sum(),
                             rtol=1e-5)


def test_axis_reductions_match_numpy():
  batch = core_reference.random_batch(3)
  x, mask = batch["values"], batch["mask"]
  for b in range(x.shape[0]):
    row = x[b][mask[b].astype(bool)]
    expected = row.mean() if row.size else 0.0
    np.testing.assert_allclose(masking.masked_mean(x, mask, axis=1)[b],
                               expected, rtol=1e-5, atol=1e-7)


def test_garbage_outside_mask_is_ignored():
  x = np.array([[1.0, 2.0, np.nan], [3.0, np.inf, -np.inf]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0]])
  np.testing.assert_allclose(masking.masked_mean(x, mask), 2.0)
  out = masking.masked_whiten(x, mask)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out[mask == 0], 0.0)


def test_padding_invariance():
  batch = core_reference.random_batch(4)
  x, mask = batch["values"], batch["mask"]
  padded_x = np.pad(x, ((0, 0), (0, 5)), constant_values=7.0)
  padded_mask = np.pad(mask, ((0, 0), (0, 5)))
  np.testing.assert_allclose(
      masking.masked_whiten(padded_x, padded_mask)[:, :x.shape[1]],
      masking.masked_whiten(x, mask), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("valid", [0, 1])
def test_degenerate_counts_are_finite(valid):
  x = np.array([[5.0, 1.0]], np.float32)
  mask = np.array([[valid, 0]])
  assert float(masking.masked_mean(x, mask)) == (5.0 if valid else 0.0)
  assert float(masking.masked_var(x, mask)) == 0.0
  out = np.asarray(masking.masked_whiten(x, mask))
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, 0.0)


def test_constant_values_whiten_to_zero():
  x = np.full((2, 3), 0.3, np.float32)
  np.testing.assert_allclose(masking.masked_whiten(x, np.ones((2, 3))), 0.0,
                             atol=1e-3)


def test_shift_mean_false_adds_mean_back():
  x = np.array([[1.0, 2.0, 3.0]], np.float32)
  out = masking.masked_whiten(x, np.ones_like(x), shift_mean=False)
  # mean 2, unbiased var 1: (x - 2)/1 + 2.
  np.testing.assert_allclose(out, [[1.0, 2.0, 3.0]], rtol=1e-6)


def test_bad_mask_shape_raises():
  with pytest.raises(ValueError, match="mask"):
    masking.masked_mean(np.ones((2, 3)), np.ones((3, 2)))


def test_masked_count():
  mask = np.array([[1, 0, 1], [0, 0, 0]])
  assert float(masking.masked_count(mask)) == 2.0
  np.testing.assert_array_equal(masking.masked_count(mask, axis=1), [2, 0])
