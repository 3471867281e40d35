"""Multi-device tests: batch statistics are global when the batch is split.

Runs on the 8 fake CPU devices configured in tests/conftest.py. The batch of
16 rows is split 2 rows per device, so each group of 4 samples spans two
devices: per-device statistics would be wrong.
"""


import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import rl_rewards.core as rc
from . import core_reference

_B, _T, _N = 16, 8, 4


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def _batch():
  batch = core_reference.random_batch(21, batch=_B, length=_T)
  rng = np.random.default_rng(0)
  scores = rng.integers(0, 3, _B).astype(np.float32) / 2
  scores[:_N] = 1.0  # One zero-variance group.
  step_rewards = rng.uniform(-1, 1, (_B, _T)).astype(np.float32)
  return batch, scores, step_rewards


def _pipeline(scores, rewards, values, mask, ids, step_rewards):
  out = {}
  for estimator in ("grpo", "rloo"):
    out[estimator] = rc.group_advantages(scores, _N, estimator=estimator)
  adv, ret = rc.gae(rewards, values, mask, gamma=0.99, lam=0.95)
  out["gae"] = rc.masked_whiten(adv, mask)
  out["gae_returns"] = ret
  out["pure"] = rc.pure_advantages(step_rewards, ids, mask, _N,
                                   solved=scores)[0]
  out["loss"] = rc.aggregate_loss(values, mask, mode="seq-mean-token-mean")
  return out


def test_jit_with_named_sharding_matches_single_device():
  batch, scores, step_rewards = _batch()
  args = (scores, batch["rewards"], batch["values"], batch["mask"],
          batch["ids"], step_rewards)
  expected = jax.jit(_pipeline)(*args)
  mesh = _mesh()
  sharded = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args]
  assert len(sharded[1].sharding.device_set) == 8
  actual = jax.jit(_pipeline)(*sharded)
  for key, value in expected.items():
    np.testing.assert_allclose(actual[key], value, rtol=1e-5, atol=1e-5,
                               err_msg=key)


def _shard_mapped(scores, values, mask, step_rewards, ids):
  kw = dict(axis_name="data")
  out = {
      "mean": rc.masked_mean(values, mask, **kw),
      "var": rc.masked_var(values, mask, **kw),
      "whiten": rc.masked_whiten(values, mask, **kw),
      "grpo": rc.group_advantages(scores, _N, estimator="grpo", **kw),
      "rloo": rc.group_advantages(scores, _N, estimator="rloo", **kw),
      "std": rc.group_statistics(scores, _N, **kw)[1],
      "token_mean": rc.aggregate_loss(values, mask, **kw),
      "pure": rc.pure_advantages(step_rewards, ids, mask, _N, solved=scores,
                                 **kw)[0],
      "process": rc.grpo_process_advantages(
          step_rewards, rc.step_mask_from_ids(ids, _T), ids, _N, **kw),
      "dpo": rc.implicit_prm_dpo_loss(values, mask, scores, _N, beta=0.5,
                                      **kw),
  }
  return out


def _single_device(scores, values, mask, step_rewards, ids):
  return {
      "mean": rc.masked_mean(values, mask),
      "var": rc.masked_var(values, mask),
      "whiten": rc.masked_whiten(values, mask),
      "grpo": rc.group_advantages(scores, _N, estimator="grpo"),
      "rloo": rc.group_advantages(scores, _N, estimator="rloo"),
      "std": rc.group_statistics(scores, _N)[1],
      "token_mean": rc.aggregate_loss(values, mask),
      "pure": rc.pure_advantages(step_rewards, ids, mask, _N,
                                 solved=scores)[0],
      "process": rc.grpo_process_advantages(
          step_rewards, rc.step_mask_from_ids(ids, _T), ids, _N),
      "dpo": rc.implicit_prm_dpo_loss(values, mask, scores, _N, beta=0.5),
  }


def test_shard_map_with_axis_name_matches_single_device():
  batch, scores, step_rewards = _batch()
  values, mask, ids = batch["values"], batch["mask"], batch["ids"]
  expected = jax.jit(_single_device)(scores, values, mask, step_rewards, ids)
  scalars = ("mean", "var", "token_mean", "dpo")
  out_specs = {k: P() if k in scalars else P("data") for k in expected}
  fn = jax.jit(jax.shard_map(
      _shard_mapped, mesh=_mesh(), in_specs=P("data"), out_specs=out_specs))
  actual = fn(scores, values, mask, step_rewards, ids)
  for key, value in expected.items():
    np.testing.assert_allclose(actual[key], value, rtol=1e-5, atol=1e-5,
                               err_msg=key)
