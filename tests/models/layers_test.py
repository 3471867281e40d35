"""Scanned and rematerialised blocks: same model, smaller programs."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.sharding import axes

VOCAB = 13
CFG = models.preset("test", VOCAB)
SCAN_CFG = CFG.replace(scan_layers=True)
HEADS = ("lm", "score")

# Two rows of length 7; the second is left-padded by 3.
TOKENS = np.array([[3, 7, 1, 12, 5, 5, 9],
                   [0, 0, 0, 4, 11, 2, 6]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1],
                 [0, 0, 0, 1, 1, 1, 1]], np.int32)
VALID = MASK.astype(bool)


@pytest.fixture(scope="module")
def params():
  """Per-layer parameters with random biases and norm scales."""
  p = models.init_params(CFG, jax.random.key(0), heads=HEADS)
  rs = np.random.RandomState(1)
  return jax.tree.map(
      lambda x: jnp.asarray(x + 0.1 * rs.randn(*x.shape).astype(np.float32)),
      p)


def _loss(cfg, params):
  """Next-token NLL on real tokens + squared scores; returns the outputs."""
  logits, _ = models.apply(cfg, params, TOKENS, attention_mask=MASK)
  scores, _ = models.apply(cfg, params, TOKENS, attention_mask=MASK,
                           head="score")
  logp = jax.nn.log_softmax(logits[:, :-1])
  nll = -jnp.take_along_axis(logp, TOKENS[:, 1:, None], axis=-1)[..., 0]
  loss = (jnp.sum(jnp.where(VALID[:, 1:] & VALID[:, :-1], nll, 0.0)) +
          jnp.sum(jnp.where(VALID, jnp.square(scores), 0.0)))
  return loss, (logits, scores)


@functools.lru_cache(maxsize=None)
def _jit_loss_and_grad(cfg):
  return jax.jit(jax.value_and_grad(functools.partial(_loss, cfg),
                                    has_aux=True))


def _assert_trees_close(actual, expected, rtol=1e-5):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    a, e = np.asarray(a), np.asarray(e)
    assert a.shape == e.shape
    np.testing.assert_allclose(a, e, rtol=rtol,
                               atol=rtol * max(np.abs(e).max(), 1e-3))


class TestConfig:

  def test_rejects_unknown_remat(self):
    with pytest.raises(ValueError, match=r"ModelConfig.remat.*'some'"):
      CFG.replace(remat="some")

  def test_rejects_non_bool_scan_layers(self):
    with pytest.raises(ValueError, match="scan_layers"):
      CFG.replace(scan_layers="yes")


class TestLayouts:

  def test_init_is_the_same_model_in_both_layouts(self):
    flat = models.init_params(CFG, jax.random.key(3), heads=HEADS)
    stacked = models.init_params(SCAN_CFG, jax.random.key(3), heads=HEADS)
    assert set(stacked) == {"embed", "layers", "final_norm", "lm_head",
                            "score_kernel", "score_bias"}
    assert stacked["layers"]["attention"]["q_kernel"].shape == (2, 32, 4, 8)
    jax.tree.map(np.testing.assert_array_equal, stacked,
                 models.stack_layers(CFG, flat))
    # Layers are drawn independently of each other.
    q = stacked["layers"]["attention"]["q_kernel"]
    assert not np.allclose(q[0], q[1])

  def test_stack_unstack_round_trip(self, params):
    stacked = models.stack_layers(CFG, params)
    np.testing.assert_array_equal(
        stacked["layers"]["mlp"]["down_kernel"][1],
        params["layers_1"]["mlp"]["down_kernel"])
    jax.tree.map(np.testing.assert_array_equal,
                 models.unstack_layers(CFG, stacked), params)
    host = models.stack_layers(CFG, jax.device_get(params))
    assert isinstance(host["layers"]["mlp"]["up_kernel"], np.ndarray)
    with pytest.raises(ValueError, match="per-layer"):
      models.stack_layers(CFG, stacked)
    with pytest.raises(ValueError, match="stacked"):
      models.unstack_layers(CFG, params)
    with pytest.raises(ValueError, match="leading axis of 3"):
      models.unstack_layers(CFG.replace(num_layers=3), stacked)

  def test_logical_axes(self, params):
    flat = models.param_logical_axes(CFG, heads=HEADS)
    specs = models.param_logical_axes(SCAN_CFG, heads=HEADS)
    stacked = models.stack_layers(CFG, params)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
    assert (jax.tree.structure(specs, is_leaf=is_spec) ==
            jax.tree.structure(stacked))
    for spec, leaf in zip(jax.tree.leaves(specs, is_leaf=is_spec),
                          jax.tree.leaves(stacked)):
      assert len(spec) == leaf.ndim
    for path in (("attention", "q_kernel"), ("mlp", "down_kernel"),
                 ("input_norm", "scale")):
      per_layer = flat["layers_0"][path[0]][path[1]]
      assert specs["layers"][path[0]][path[1]] == (
          jax.sharding.PartitionSpec(axes.LAYERS, *per_layer))
    assert specs["embed"] == flat["embed"]
    assert (axes.LAYERS, None) in axes.DEFAULT_RULES

  def test_init_from_backbone(self, params):
    stacked = models.stack_layers(CFG, params)
    value = models.init_from_backbone(SCAN_CFG, stacked, jax.random.key(5))
    flat_value = models.init_from_backbone(CFG, params, jax.random.key(5))
    assert "lm_head" not in value
    jax.tree.map(np.testing.assert_array_equal, value,
                 models.stack_layers(CFG, flat_value))
    jax.tree.map(np.testing.assert_array_equal, value["layers"],
                 stacked["layers"])
    with pytest.raises(ValueError, match="stack_layers"):
      models.init_from_backbone(SCAN_CFG, params, jax.random.key(5))

  def test_apply_rejects_the_other_layout(self, params):
    with pytest.raises(ValueError, match="stack_layers"):
      models.apply(SCAN_CFG, params, TOKENS)
    with pytest.raises(ValueError, match="unstack_layers"):
      models.apply(CFG, models.stack_layers(CFG, params), TOKENS)
    with pytest.raises(ValueError, match="layout"):
      models.apply(SCAN_CFG, models.stack_layers(CFG, params), TOKENS,
                   cache=models.init_cache(CFG, 2, 8), cache_index=0)


class TestSameModel:
  """Every (scan_layers, remat) gives the outputs and gradients of the
  plain per-layer model."""

  @pytest.fixture(scope="class")
  @classmethod
  def reference(cls, params):
    (loss, (logits, scores)), grads = _jit_loss_and_grad(CFG)(params)
    return loss, logits, scores, grads

  @pytest.mark.parametrize("scan_layers,remat", [
      (False, "full"), (False, "dots"),
      (True, "none"), (True, "full"), (True, "dots")])
  def test_outputs_and_gradients(self, params, reference, scan_layers,
                                 remat):
    cfg = CFG.replace(scan_layers=scan_layers, remat=remat)
    p = models.stack_layers(CFG, params) if scan_layers else params
    (loss, (logits, scores)), grads = _jit_loss_and_grad(cfg)(p)
    ref_loss, ref_logits, ref_scores, ref_grads = reference
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(logits)[VALID],
                               np.asarray(ref_logits)[VALID], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(scores)[VALID],
                               np.asarray(ref_scores)[VALID], rtol=1e-5,
                               atol=1e-5)
    if scan_layers:
      ref_grads = models.stack_layers(CFG, ref_grads)
    assert (jax.tree.structure(grads) == jax.tree.structure(ref_grads))
    _assert_trees_close(grads, ref_grads)
    # Every block parameter gets a gradient (none is silently dropped).
    for leaf in jax.tree.leaves(grads):
      assert np.abs(np.asarray(leaf)).max() > 0

  def test_scanned_cache_prefill_and_decode_match_full(self, params):
    stacked = models.stack_layers(CFG, params)
    full, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK)
    cache = models.init_cache(SCAN_CFG, 2, 10)
    assert cache.stacked and len(cache.k) == CFG.num_layers
    assert cache.k.shape == (CFG.num_layers, 2, CFG.num_kv_heads, 10,
                             CFG.head_dim)
    first, cache = models.apply(SCAN_CFG, stacked, TOKENS[:, :4],
                                attention_mask=MASK[:, :4], cache=cache,
                                cache_index=0)
    valid = VALID[:, :4]
    np.testing.assert_allclose(np.asarray(first)[valid],
                               np.asarray(full[:, :4])[valid], atol=1e-5)
    step = jax.jit(lambda c, tok, m, i: models.apply(
        SCAN_CFG, stacked, tok, attention_mask=m, cache=c, cache_index=i))
    for t in range(4, 7):
      out, cache = step(cache, TOKENS[:, t:t + 1], MASK[:, t:t + 1],
                        jnp.int32(t))
      np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-5)
    assert cache.stacked
    np.testing.assert_array_equal(cache.key_mask[:, :7], VALID)
    # The per-layer cache holds the same keys and values in the real slots
    # (padding slots hold whatever the padding queries computed).
    flat_cache = models.init_cache(CFG, 2, 10)
    _, flat_cache = models.apply(CFG, params, TOKENS, attention_mask=MASK,
                                 cache=flat_cache, cache_index=0)
    for i in range(CFG.num_layers):
      for a, b in ((cache.k[i], flat_cache.k[i]),
                   (cache.v[i], flat_cache.v[i])):
        a, b = np.swapaxes(a, 1, 2), np.swapaxes(b, 1, 2)  # [B, S, ...]
        np.testing.assert_allclose(a[:, :7][VALID], b[:, :7][VALID],
                                   atol=1e-5)
    assert not np.any(cache.k[:, :, :, 7:])

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_decode_step_reads_the_cache_in_place(self, scan_layers):
    # Stored [B, KVH, S, Dh] and read through a [B, S, KVH, Dh] view, the
    # cache is neither transposed nor copied by a decoding step (stored
    # [B, S, KVH, Dh], XLA copies every layer's keys and values into the
    # [B, KVH, ...] order of the attention matmuls at every step).
    cfg = CFG.replace(scan_layers=scan_layers)
    p = models.init_params(cfg, jax.random.key(0))
    cache = models.init_cache(cfg, 2, 37)
    step = jax.jit(lambda c, tok, i: models.apply(
        cfg, p, tok, cache=c, cache_index=i), donate_argnums=0)
    text = step.lower(cache, jnp.zeros((2, 1), jnp.int32),
                      jnp.int32(5)).compile().as_text()
    layer_size = 2 * cfg.num_kv_heads * 37 * cfg.head_dim
    moved = []
    pattern = r"= \w+\[([\d,]*)\]\S* (?:transpose|copy)\("
    for dims in re.findall(pattern, text):
      if np.prod([int(d) for d in dims.split(",") if d]) >= layer_size:
        moved.append(dims)
    assert not moved, moved


# --------------------------------------------------- compiled program size --


@functools.lru_cache(maxsize=None)
def _program_stats(num_layers, scan_layers, remat):
  """(dot ops, instructions) of the optimized HLO of a value_and_grad step."""
  cfg = CFG.replace(num_layers=num_layers, scan_layers=scan_layers,
                    remat=remat)
  params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
      models.init_params(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)

  def loss(p, t):
    logits, _ = models.apply(cfg, p, t)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  hlo = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
  text = hlo.as_text()
  dots = len(re.findall(r"\bdot\(", text))
  instructions = len(re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = ", text,
                                re.MULTILINE))
  return dots, instructions


class TestProgramSize:

  def test_scanned_program_does_not_grow_with_depth(self):
    dots_2, size_2 = _program_stats(2, True, "none")
    dots_8, size_8 = _program_stats(8, True, "none")
    assert dots_8 == dots_2
    assert abs(size_8 - size_2) <= 0.05 * size_2

  def test_per_layer_program_grows_with_depth(self):
    dots_2, _ = _program_stats(2, False, "none")
    dots_8, _ = _program_stats(8, False, "none")
    # About 27 dots per block (9 forward, 18 backward) plus the head.
    assert dots_8 > 3.5 * dots_2

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_remat_recomputes_matmuls(self, scan_layers):
    # Per block, "dots" recomputes the two attention products (batched
    # matmuls) and "full" every forward matmul the backward pass needs
    # (2 and 8 extra dots per block in the program with jax 0.10); the
    # recomputation survives XLA's optimizations.
    none, _ = _program_stats(2, scan_layers, "none")
    dots, _ = _program_stats(2, scan_layers, "dots")
    full, _ = _program_stats(2, scan_layers, "full")
    assert none < dots < full
    assert full - none >= 3 * (dots - none)


# ------------------------------------------- sliding and full layers mixed --

# Gemma-3-like: (1 + w) norms, sandwich, GELU, q/k norms, sliding layers
# (window 3) around a full one, each type with its own RoPE base.
MIXED_CFG = CFG.replace(
    num_layers=3, layer_types=("sliding", "full", "sliding"),
    sliding_window=3, local_rope_theta=100.0, rope_theta=1e4, qk_norm=True,
    norm_placement="sandwich", rms_scale_offset=1.0,
    mlp_activation="gelu_tanh", embed_scale=32 ** 0.5,
    query_pre_attn_scalar=6.0, attention_bias=False)


def test_attention_masks_by_hand():
  cfg = MIXED_CFG
  slot = jnp.arange(5)
  valid = jnp.array([[0, 1, 1, 1, 1]], bool)
  masks = models.attention_masks(cfg, slot, slot, valid)
  assert sorted(masks) == ["full", "sliding"]
  # Row t: keys s <= t, s valid; sliding also t - s < 3.
  np.testing.assert_array_equal(np.asarray(masks["full"][0], int), [
      [0, 0, 0, 0, 0],
      [0, 1, 0, 0, 0],
      [0, 1, 1, 0, 0],
      [0, 1, 1, 1, 0],
      [0, 1, 1, 1, 1]])
  np.testing.assert_array_equal(np.asarray(masks["sliding"][0], int), [
      [0, 0, 0, 0, 0],
      [0, 1, 0, 0, 0],
      [0, 1, 1, 0, 0],
      [0, 1, 1, 1, 0],
      [0, 0, 1, 1, 1]])
  # A decode step: query slot 7 of a 9-slot cache.
  step = models.attention_masks(cfg, jnp.array([7]), jnp.arange(9),
                                jnp.ones((1, 9), bool))
  np.testing.assert_array_equal(np.asarray(step["sliding"][0, 0], int),
                                [0, 0, 0, 0, 0, 1, 1, 1, 0])


def test_sliding_layers_see_only_the_window():
  """Two sliding layers of window 2: output t depends on slots t-2..t."""
  cfg = MIXED_CFG.replace(num_layers=2, layer_types=("sliding",) * 2,
                          sliding_window=2)
  p = models.init_params(cfg, jax.random.key(3))
  tokens = np.array([[3, 7, 1, 12, 5, 5, 9]], np.int32)
  base, _ = models.apply(cfg, p, tokens)
  changed = tokens.copy()
  changed[0, 2] = 4
  out, _ = models.apply(cfg, p, changed)
  diff = np.abs(np.asarray(out) - np.asarray(base)).max(axis=-1)[0]
  assert (diff[:2] == 0).all() and (diff[2:5] > 1e-4).all()
  assert (diff[5:] == 0).all()  # slot 2 is outside 5's and 6's receptive field


@pytest.fixture
def fast_compiles():
  # Optimisation passes dominate the compile time of these tiny programs.
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="module")
def mixed_params():
  p = models.init_params(MIXED_CFG, jax.random.key(0), heads=HEADS)
  rs = np.random.RandomState(2)
  return jax.tree.map(
      lambda x: jnp.asarray(x + 0.1 * rs.randn(*x.shape).astype(np.float32)),
      p)


@pytest.mark.parametrize("remat", [pytest.param("none",
                                                marks=pytest.mark.slow),
                                   "full"])
def test_mixed_layers_scanned_equals_per_layer(mixed_params, remat,
                                               fast_compiles):
  """The scanned layer-type flag picks each layer's mask and RoPE table."""
  del fast_compiles
  (loss, (logits, scores)), grads = _jit_loss_and_grad(MIXED_CFG)(
      mixed_params)
  cfg = MIXED_CFG.replace(scan_layers=True, remat=remat)
  stacked = models.stack_layers(MIXED_CFG, mixed_params)
  (s_loss, (s_logits, s_scores)), s_grads = _jit_loss_and_grad(cfg)(stacked)
  np.testing.assert_allclose(s_loss, loss, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(s_logits)[VALID],
                             np.asarray(logits)[VALID], atol=1e-5)
  np.testing.assert_allclose(np.asarray(s_scores)[VALID],
                             np.asarray(scores)[VALID], atol=1e-5)
  _assert_trees_close(s_grads, models.stack_layers(MIXED_CFG, grads))
  # Swapping the layer types changes the model: the flag is really read.
  swapped = cfg.replace(layer_types=("full", "sliding", "full"))
  other, _ = models.apply(swapped, stacked, TOKENS, attention_mask=MASK)
  assert np.abs(np.asarray(other) - np.asarray(s_logits))[VALID].max() > 1e-3
