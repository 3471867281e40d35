"""Micro-batched forward passes over a rollout equal the whole-batch pass."""

import jax
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.train import steps

VOCAB = 13
CFG = models.preset("test", VOCAB)


def _rollout(rows=12, length=10, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, (rows, length)).astype(np.int32)
  mask = np.ones((rows, length), np.int32)
  mask[::3, :3] = 0                          # left-padded prompts
  for b, end in enumerate(rng.integers(5, length + 1, rows)):
    mask[b, end:] = 0                        # ragged responses
  return tokens, mask


def _check(make, params, reference):
  tokens, mask = _rollout()
  whole = jax.jit(make(0))(params, tokens, mask)
  np.testing.assert_allclose(whole, reference(params, tokens, mask),
                             atol=1e-5)
  # 3 and 4 rows divide the 12; 5 pads them to 15.
  for rows in (3, 4, 5):
    got = jax.jit(make(rows))(params, tokens, mask)
    assert got.shape == whole.shape
    # Float noise only: XLA may order a dot differently for fewer rows.
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6,
                               err_msg=f"{rows} rows")


def test_logprob_pass():
  _check(lambda rows: steps.make_logprob_fn(CFG, micro_batch_size=rows,
                                            chunk_size=4),
         models.init_params(CFG, jax.random.key(0)),
         lambda p, t, m: models.token_logprobs(CFG, p, t, m))


def test_values_pass():
  _check(lambda rows: steps.make_values_fn(CFG, micro_batch_size=rows),
         models.init_params(CFG, jax.random.key(0), heads=("score",)),
         lambda p, t, m: steps.token_values(CFG, p, t, m))
