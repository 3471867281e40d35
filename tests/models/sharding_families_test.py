"""Family features on an 8-device mesh: logical axes, sharded steps, decode.

Qwen3-like (q/k norms, head_dim != D / H) and Gemma-3-like (sandwich norms,
(1 + w) RMSNorm, GELU, interleaved sliding / full layers with their own RoPE
bases) tiny configs, in both parameter layouts: every parameter has logical
axis names, an SFT step sharded over (data 2, fsdp 2, tensor 2) equals the
single-device step, and a KV-cache prefill + decode step on the mesh gives
the logits of the unsharded full forward pass.
"""

import math

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from rl_rewards import models
from rl_rewards.runners import context as context_lib
from rl_rewards.sharding import axes
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import steps

VOCAB = 24
_BASE = models.preset("test", VOCAB).replace(attention_bias=False)
CONFIGS = {
    "qwen3": _BASE.replace(architecture="qwen3", qk_norm=True, head_dim=16),
    "gemma3": _BASE.replace(
        architecture="gemma3_text", qk_norm=True, norm_placement="sandwich",
        rms_scale_offset=1.0, mlp_activation="gelu_tanh",
        embed_scale=math.sqrt(32), query_pre_attn_scalar=12.0,
        tie_word_embeddings=True, num_layers=3,
        layer_types=("sliding", "full", "sliding"), sliding_window=3,
        rope_theta=1e6, local_rope_theta=1e4),
}


@pytest.fixture(scope="module", autouse=True)
def fast_compiles():
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


def _noisy(cfg, seed=0):
  """Parameters with norm scales away from their initial value."""
  params = models.init_params(cfg, jax.random.key(seed), heads=("lm",
                                                                "score"))
  rs = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: x + 0.1 * rs.randn(*x.shape).astype(np.float32), params)


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_parameter_has_logical_axes(name, scan_layers):
  cfg = CONFIGS[name].replace(scan_layers=scan_layers)
  specs = models.param_logical_axes(cfg, heads=("lm", "score"))
  shapes = models.abstract_params(cfg, heads=("lm", "score"))
  flat_specs = jax.tree_util.tree_leaves_with_path(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  flat_shapes = jax.tree.leaves(shapes)
  assert len(flat_specs) == len(flat_shapes)
  for (path, spec), shape in zip(flat_specs, flat_shapes):
    assert len(spec) == len(shape.shape), (path, spec, shape)
    assert all(name is not None for name in spec), (path, spec)
  block = specs["layers"] if scan_layers else specs["layers_0"]
  assert block["attention"]["q_norm"]["scale"] == jax.sharding.PartitionSpec(
      *((axes.LAYERS,) if scan_layers else ()), axes.NORM)
  if name == "gemma3":
    assert "post_feedforward_norm" in block


def _batch(rng, rows=8, length=10):
  tokens = rng.integers(1, VOCAB, (rows, length)).astype(np.int32)
  mask = np.ones((rows, length), np.int32)
  mask[:, :2] = 0
  tokens[:, :2] = 0
  loss_mask = np.zeros_like(mask)
  loss_mask[:, 5:] = 1
  return {"tokens": tokens, "attention_mask": mask, "loss_mask": loss_mask}


def _sft(mesh, cfg, params, batch, tx):
  state, shardings = context_lib.create_state(cfg, mesh, params, tx)
  with mesh_lib.activate(mesh):
    step = jax.jit(steps.make_sft_step(cfg, tx),
                   in_shardings=(shardings, mesh_lib.batch_sharding(mesh)),
                   out_shardings=(shardings, None))
    state, metrics = step(state, mesh_lib.put_batch(batch, mesh))
  return state, float(metrics["loss"])


@pytest.mark.parametrize("name,scan_layers", [
    ("gemma3", True), pytest.param("qwen3", False, marks=pytest.mark.slow)])
def test_sharded_sft_step_matches_single_device(name, scan_layers):
  cfg = CONFIGS[name].replace(scan_layers=scan_layers)
  params = _noisy(cfg)
  params.pop("score_kernel"), params.pop("score_bias")
  batch = _batch(np.random.default_rng(0))
  tx = optax.sgd(1e-2)
  single = mesh_lib.make_mesh(dict(data=1, fsdp=1, tensor=1),
                              devices=jax.devices()[:1])
  ref_state, ref_loss = _sft(single, cfg, params, batch, tx)
  mesh = mesh_lib.make_mesh(dict(data=2, fsdp=2, tensor=2))
  state, loss = _sft(mesh, cfg, params, batch, tx)
  assert np.isfinite(loss)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(state.params),
                       jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)


@pytest.mark.parametrize("name,scan_layers", [
    ("gemma3", True), ("qwen3", False),
    pytest.param("gemma3", False, marks=pytest.mark.slow)])
def test_sharded_cached_decode_matches_full_forward(name, scan_layers):
  """Prefill 6 slots, then decode 3 more one by one (past gemma3's window
  of 3)."""
  cfg = CONFIGS[name].replace(scan_layers=scan_layers)
  params = _noisy(cfg)
  params.pop("score_kernel"), params.pop("score_bias")
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, VOCAB, (4, 9)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[1, :2] = mask[3, :4] = 0  # left padding
  full, _ = models.apply(cfg, params, tokens, attention_mask=mask)

  mesh = mesh_lib.make_mesh(dict(data=2, fsdp=2, tensor=2))
  with mesh_lib.activate(mesh):
    shardings = nn.logical_to_mesh_sharding(
        models.param_logical_axes(cfg), mesh, axes.DEFAULT_RULES)
    placed = jax.device_put(params, shardings)
    cache = models.init_cache(cfg, 4, 9)
    out, cache = models.apply(cfg, placed, tokens[:, :6],
                              attention_mask=mask[:, :6], cache=cache,
                              cache_index=0)
    decoded = [out]
    for t in range(6, 9):
      out, cache = models.apply(cfg, placed, tokens[:, t:t + 1],
                                attention_mask=mask[:, t:t + 1], cache=cache,
                                cache_index=t)
      decoded.append(out)
  decoded = np.concatenate([np.asarray(x) for x in decoded], axis=1)
  valid = mask.astype(bool)
  np.testing.assert_allclose(decoded[valid], np.asarray(full)[valid],
                             atol=1e-5)
