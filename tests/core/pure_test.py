"""Tests for rl_rewards.core.pure (PURE min-form credit assignment)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards.core import pure
from rl_rewards.core import returns
from . import core_reference

_JIT_SOFTMIN = jax.jit(pure.softmin_step_rewards)
_JIT_PIPELINE = jax.jit(
    pure.pure_advantages,
    static_argnames=("group_size", "temperature", "baseline",
                     "mask_step_ends", "normalize"))

# TV-8: response A = [a, a, SEP, a, EOS] (steps end at 2 and 4), response
# B = [b, EOS] padded to 5 tokens; transformed step rewards given.
_TV8_IDS = np.array([[0, 0, 0, 1, 1], [0, 0, -1, -1, -1]])
_TV8_MASK = (_TV8_IDS >= 0).astype(np.int32)
_TV8_REWARDS = np.array([[-0.3, 0.1], [0.4, 0.0]], np.float32)
_TV8_SOLVED = np.array([0.0, 1.0], np.float32)


@pytest.mark.parametrize("fn", [pure.softmin_step_rewards, _JIT_SOFTMIN])
def test_softmin_tv7(fn):
  r = np.array([[0.8, -0.4, 0.6]], np.float32)
  m = np.ones((1, 3))
  np.testing.assert_allclose(fn(r, m, 0.1),
                             [[0.000005, -0.399979, 0.000027]], atol=1e-6)
  # Sum-form returns of r* approximate the paper's min-form.
  np.testing.assert_allclose(returns.step_returns(fn(r, m, 0.1), m),
                             [[-0.399947, -0.399952, 0.000027]], atol=1e-6)
  np.testing.assert_allclose(returns.step_returns(fn(r, m, 1.0), m),
                             [[0.036956, -0.107408, 0.132246]], atol=1e-6)
  np.testing.assert_allclose(returns.step_returns(fn(r, m, 0.01), m),
                             [[-0.4, -0.4, 0.0]], atol=1e-6)


def test_softmin_ties_split_the_weight():
  r = np.array([[-0.4, 0.5, -0.4]], np.float32)
  out = _JIT_SOFTMIN(r, np.ones((1, 3)), 0.001)
  np.testing.assert_allclose(out, [[-0.2, 0.0, -0.2]], atol=1e-6)


def test_softmin_random_and_degenerate_rows():
  rng = np.random.default_rng(0)
  r = rng.uniform(-1, 1, (5, 6)).astype(np.float32)
  m = np.arange(6)[None, :] < np.array([0, 1, 6, 3, 2])[:, None]
  out = np.asarray(_JIT_SOFTMIN(r, m, 0.1))
  np.testing.assert_allclose(out, core_reference.softmin_reference(r, m, 0.1),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out[0], 0.0)  # No valid steps, no NaN.
  np.testing.assert_allclose(out[1, 0], r[1, 0], rtol=1e-6)  # One step.
  # Padding invariance: extra invalid steps with extreme rewards.
  out_pad = _JIT_SOFTMIN(np.pad(r, ((0, 0), (0, 2)), constant_values=-9.0),
                         np.pad(m, ((0, 0), (0, 2))), 0.1)
  np.testing.assert_allclose(np.asarray(out_pad)[:, :6], out, rtol=1e-6)


def test_token_and_step_baselines_tv8():
  token = pure.pure_rloo_step_rewards(_TV8_REWARDS, _TV8_IDS, _TV8_MASK, 2)
  np.testing.assert_allclose(token, [[-0.7, -0.1], [0.44, 0.0]], atol=1e-6)
  step = pure.pure_rloo_step_rewards(_TV8_REWARDS, _TV8_IDS, _TV8_MASK, 2,
                                     baseline="step")
  np.testing.assert_allclose(step, [[-0.7, -0.3], [0.5, 0.0]], atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_full_pipeline_tv8(jit):
  fn = _JIT_PIPELINE if jit else pure.pure_advantages
  adv, ret = fn(_TV8_REWARDS, _TV8_IDS, _TV8_MASK, group_size=2,
                temperature=None, solved=_TV8_SOLVED)
  np.testing.assert_allclose(
      ret, [[-1.8, -1.8, -1.8, -1.1, -1.1], [1.44, 1.44, 0, 0, 0]],
      atol=1e-6)
  np.testing.assert_allclose(
      adv, [[-0.653071, -0.653071, 0, -0.188960, 0],
            [1.495102, 0, 0, 0, 0]], atol=1e-5)


def test_mask_step_end_tokens():
  out = pure.mask_step_end_tokens(np.ones((2, 5)), _TV8_IDS)
  np.testing.assert_allclose(out, [[1, 1, 0, 1, 0], [1, 0, 1, 1, 1]])


def test_pure_normalize_reference_and_degenerate():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((4, 7)).astype(np.float32)
  x[rng.random((4, 7)) < 0.3] = 0.0
  m = np.arange(7)[None, :] < np.array([7, 3, 0, 5])[:, None]
  valid = x[m]
  nonzero = valid[valid != 0]
  mean = nonzero.mean()
  rstd = 1 / np.sqrt(max(((valid - mean) ** 2).sum() / nonzero.size, 1e-8))
  expected = np.where(m & (x != 0), (x - mean) * rstd, 0)
  np.testing.assert_allclose(pure.pure_normalize(x, m), expected, rtol=1e-5,
                             atol=1e-6)
  out = pure.pure_normalize(np.zeros((2, 3)), np.ones((2, 3)))
  np.testing.assert_array_equal(out, 0.0)


def test_group_of_one_and_empty_rows_are_finite():
  ids = np.array([[0, 1, 1, -1], [-1, -1, -1, -1]])
  adv, ret = _JIT_PIPELINE(np.array([[0.5, -0.5, 0.0], [0.2, 0.2, 0.2]],
                                    np.float32), ids,
                           (ids >= 0).astype(np.int32), group_size=1,
                           solved=np.array([1.0, 0.0], np.float32))
  assert np.all(np.isfinite(adv)) and np.all(np.isfinite(ret))
  np.testing.assert_array_equal(np.asarray(adv)[1], 0.0)


def test_bad_temperature_raises():
  with pytest.raises(ValueError, match="temperature"):
    pure.softmin_step_rewards(np.ones((1, 2)), np.ones((1, 2)), 0.0)
  with pytest.raises(ValueError, match="baseline"):
    pure.pure_rloo_step_rewards(_TV8_REWARDS, _TV8_IDS, _TV8_MASK, 2,
                                baseline="prompt")


def _token_baseline_reference(r, ids, mask, n):
  out = np.zeros(r.shape)
  totals = r.sum(1)
  lengths = mask.sum(1)
  for i in range(len(r)):
    group = range(i // n * n, i // n * n + n)
    other_len = sum(lengths[j] for j in group if j != i)
    b = sum(totals[j] for j in group if j != i) / other_len if other_len else 0
    for k in range(r.shape[1]):
      tokens = int(np.sum(ids[i] == k))
      if tokens:
        out[i, k] = r[i, k] - b * (tokens - 1)
  return out


def test_token_baseline_random_matches_reference():
  batch = core_reference.random_batch(13, batch=6, length=10, num_steps=10)
  ids, mask = batch["ids"], batch["mask"]
  step_mask = core_reference.step_mask_reference(ids, 10)
  r = np.where(step_mask, batch["values"], 0).astype(np.float32)
  out = jax.jit(pure.pure_rloo_step_rewards, static_argnums=3)(r, ids, mask,
                                                               3)
  np.testing.assert_allclose(out, _token_baseline_reference(r, ids, mask, 3),
                             rtol=1e-5, atol=1e-5)


def test_min_form_step_rewards_return_the_min_form_returns():
  # r = [0.6, −0.2, 0.4] and a padded row: running min returns
  # [−0.2, −0.2, 0.4]; the paper's form zeros after the first argmin.
  rewards = jnp.array([[0.6, -0.2, 0.4], [0.5, 0.9, 0.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
  for form, want in (("running_min", [[-0.2, -0.2, 0.4], [0.5, 0.9, 0.0]]),
                     ("paper", [[-0.2, -0.2, 0.0], [0.5, 0.0, 0.0]])):
    got = pure.min_form_step_rewards(rewards, mask, form=form)
    jitted = jax.jit(lambda r, m, f=form: pure.min_form_step_rewards(
        r, m, form=f))(rewards, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jitted))
    returns = np.cumsum(np.asarray(got)[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(returns, want, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got)[1, 2], 0.0)
