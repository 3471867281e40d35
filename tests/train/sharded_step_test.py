"""A train step sharded over a device mesh equals the unsharded step."""

import jax
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.runners import context as context_lib
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import optim
from rl_rewards.train import steps


def _batch(vocab, rng, batch=16, length=12):
  tokens = rng.integers(3, vocab, size=(batch, length)).astype(np.int32)
  attention = np.ones((batch, length), np.int32)
  attention[:, :3] = 0          # left padding of the prompt
  tokens[:, :3] = 0
  loss_mask = np.zeros((batch, length), np.int32)
  loss_mask[:, 6:] = 1
  lengths = rng.integers(7, length + 1, size=batch)
  for b, end in enumerate(lengths):  # ragged responses, right padding
    loss_mask[b, end:] = 0
    attention[b, end:] = 0
  return {"tokens": tokens, "attention_mask": attention,
          "loss_mask": loss_mask}


def _run_steps(mesh, model_config, params, batches, tx):
  state, shardings = context_lib.create_state(model_config, mesh, params, tx)
  step = jax.jit(steps.make_sft_step(model_config, tx),
                 in_shardings=(shardings, mesh_lib.batch_sharding(mesh)),
                 out_shardings=(shardings, None))
  losses = []
  for batch in batches:
    state, metrics = step(state, mesh_lib.put_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
  return state, losses


@pytest.mark.parametrize("sizes", [dict(data=8, fsdp=1, tensor=1),
                                   dict(data=2, fsdp=2, tensor=2)])
def test_sharded_sft_step_matches_single_device(sizes):
  assert jax.device_count() == 8
  model_config = models.preset("test", 18)
  params = models.init_params(model_config, jax.random.key(0))
  rng = np.random.default_rng(0)
  batches = [_batch(18, rng) for _ in range(2)]
  tx = optim.make_optimizer(learning_rate=1e-2, grad_clip=1.0)

  single = mesh_lib.make_mesh(dict(data=1, fsdp=1, tensor=1),
                              devices=jax.devices()[:1])
  ref_state, ref_losses = _run_steps(single, model_config, params, batches, tx)
  mesh = mesh_lib.make_mesh(sizes)
  state, losses = _run_steps(mesh, model_config, params, batches, tx)

  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(state.params),
                       jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  # The batch really was split: every device holds a distinct row block.
  placed = mesh_lib.put_batch(batches[0], mesh)["tokens"]
  assert len(placed.addressable_shards) == 8
  rows = {(s.index[0].start, s.index[0].stop) for s in placed.addressable_shards}
  assert len(rows) == mesh_lib.batch_axis_size(mesh)


def test_batch_that_does_not_divide_the_mesh_is_rejected():
  mesh = mesh_lib.make_mesh(dict(data=8, fsdp=1, tensor=1))
  with pytest.raises(ValueError, match="not divisible by the 8-way"):
    mesh_lib.check_batch_divides(12, mesh, "config.sft")


def test_mesh_sizes_must_match_devices():
  with pytest.raises(ValueError, match="multiply to 6"):
    mesh_lib.make_mesh(dict(data=3, fsdp=2, tensor=1))
  with pytest.raises(ValueError, match="does not divide"):
    mesh_lib.make_mesh(dict(data=-1, fsdp=3, tensor=1))
  mesh = mesh_lib.make_mesh(dict(data=-1, fsdp=2, tensor=1))
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
