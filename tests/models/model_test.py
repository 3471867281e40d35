"""Tests of the decoder's pure API against a loop-based numpy reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.models import model as model_lib
from rl_rewards.models import transformer
from rl_rewards.sharding import axes

VOCAB = 13
CFG = models.preset("test", VOCAB)
TIED_CFG = CFG.replace(tie_word_embeddings=True, attention_bias=False,
                       architecture="llama", head_dim=12, num_kv_heads=1)

# Two rows of length 7; the second is left-padded by 3.
TOKENS = np.array([[3, 7, 1, 12, 5, 5, 9],
                   [0, 0, 0, 4, 11, 2, 6]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1],
                 [0, 0, 0, 1, 1, 1, 1]], np.int32)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CFG, jax.random.key(0), heads=("lm", "score"))
  # Random (non-zero, non-unit) biases and norm scales so that every
  # parameter matters in the comparisons below.
  rs = np.random.RandomState(1)
  return jax.tree.map(
      lambda x: jnp.asarray(x + 0.1 * rs.randn(*x.shape).astype(np.float32)),
      p)


# ------------------------------------------------------ numpy reference ----


def _rms_norm(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope_one(vec, position, theta):
  """Rotates one head vector, pairing element i with element i + Dh/2."""
  dh = vec.shape[0]
  half = dh // 2
  out = np.empty_like(vec)
  for i in range(half):
    angle = position * theta ** (-2.0 * i / dh)
    c, s = np.cos(angle), np.sin(angle)
    out[i] = vec[i] * c - vec[i + half] * s
    out[i + half] = vec[i + half] * c + vec[i] * s
  return out


def reference_forward(cfg, params, tokens, mask):
  """Hidden states, logits and scores with Python loops, float64."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  batch, length = tokens.shape
  h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  x = p["embed"][tokens]
  for layer in range(cfg.num_layers):
    lp = p[f"layers_{layer}"]
    attn = lp["attention"]
    normed = _rms_norm(x, lp["input_norm"]["scale"], cfg.rms_norm_eps)
    q = np.einsum("btd,dnh->btnh", normed, attn["q_kernel"])
    k = np.einsum("btd,dnh->btnh", normed, attn["k_kernel"])
    v = np.einsum("btd,dnh->btnh", normed, attn["v_kernel"])
    if cfg.attention_bias:
      q, k, v = q + attn["q_bias"], k + attn["k_bias"], v + attn["v_bias"]
    for b in range(batch):
      for t in range(length):
        for n in range(h):
          q[b, t, n] = _rope_one(q[b, t, n], positions[b, t], cfg.rope_theta)
        for n in range(kvh):
          k[b, t, n] = _rope_one(k[b, t, n], positions[b, t], cfg.rope_theta)
    heads_out = np.zeros((batch, length, h, dh))
    for b in range(batch):
      for t in range(length):
        keys = [s for s in range(t + 1) if mask[b, s]]
        if not keys:
          continue
        for n in range(h):
          kv = n // (h // kvh)
          scores = np.array([q[b, t, n] @ k[b, s, kv] for s in keys])
          scores = scores / np.sqrt(dh)
          weights = np.exp(scores - scores.max())
          weights /= weights.sum()
          heads_out[b, t, n] = sum(w * v[b, s, kv]
                                   for w, s in zip(weights, keys))
    x = x + np.einsum("btnh,nhd->btd", heads_out, attn["o_kernel"])
    normed = _rms_norm(x, lp["post_attention_norm"]["scale"],
                       cfg.rms_norm_eps)
    mlp = lp["mlp"]
    gate = normed @ mlp["gate_kernel"]
    hidden = gate / (1 + np.exp(-gate)) * (normed @ mlp["up_kernel"])
    x = x + hidden @ mlp["down_kernel"]
  x = _rms_norm(x, p["final_norm"]["scale"], cfg.rms_norm_eps)
  if cfg.tie_word_embeddings:
    logits = x @ p["embed"].T
  else:
    logits = x @ p["lm_head"]
  scores = None
  if "score_kernel" in p:
    scores = (x @ p["score_kernel"])[..., 0] + p["score_bias"][0]
  return x, logits, scores


# ---------------------------------------------------------------- tests ----


class TestConfig:

  def test_rejects_heads_not_divisible(self):
    with pytest.raises(ValueError, match="num_kv_heads"):
      CFG.replace(num_heads=4, num_kv_heads=3)

  @pytest.mark.parametrize("field,value", [
      ("dtype", "float16"), ("architecture", "gpt2"), ("hidden_size", 0),
      ("head_dim", 7), ("rms_norm_eps", 0.0), ("num_layers", 1.5)])
  def test_rejects_bad_fields(self, field, value):
    with pytest.raises(ValueError, match=field):
      CFG.replace(**{field: value})

  def test_unknown_preset(self):
    with pytest.raises(ValueError, match="Unknown model preset"):
      models.preset("huge", 10)

  def test_is_hashable_static_argument(self):
    assert hash(CFG) == hash(models.preset("test", VOCAB))
    assert CFG != TIED_CFG
    out = jax.jit(lambda c: c.hidden_size * 2, static_argnums=0)(CFG)
    assert out == 2 * CFG.hidden_size

  def test_preset_sizes(self):
    # tiny: embedding 18*128, two blocks of (attention 49,408 incl. biases
    # + MLP 3*128*384 + 2 norms of 128), final norm 128, LM head 128*18.
    tiny = models.preset("tiny", 18)
    expected = 18 * 128 + 2 * (49_408 + 147_456 + 256) + 128 + 128 * 18
    assert models.num_params(tiny) == expected == 398_976
    small = models.num_params(models.preset("small", 18))
    assert 38e6 < small < 45e6

  def test_num_params_matches_init(self, params):
    actual = sum(x.size for x in jax.tree.leaves(params))
    assert actual == models.num_params(CFG, heads=("lm", "score"))


class TestInit:

  def test_params_are_plain_float32(self, params):
    for leaf in jax.tree.leaves(params):
      assert isinstance(leaf, jax.Array) and leaf.dtype == jnp.float32
    assert set(params) == {"embed", "layers_0", "layers_1", "final_norm",
                           "lm_head", "score_kernel", "score_bias"}
    assert params["layers_0"]["attention"]["q_kernel"].shape == (32, 4, 8)
    assert params["layers_0"]["attention"]["k_kernel"].shape == (32, 2, 8)

  def test_deterministic_and_head_independent(self):
    a = models.init_params(CFG, jax.random.key(3))
    b = models.init_params(CFG, jax.random.key(3), heads=("score", "lm"))
    c = models.init_params(CFG, jax.random.key(4))
    jax.tree.map(np.testing.assert_array_equal, a, {k: b[k] for k in a})
    assert not np.allclose(a["lm_head"], c["lm_head"])

  def test_threaded_draw_equals_one_thread(self, monkeypatch):
    # Leaves are drawn on a thread pool; each has its own generator, so the
    # values cannot depend on the number of threads or their order.
    many = models.init_params(CFG, jax.random.key(3), heads=("lm", "score"))
    monkeypatch.setattr(model_lib, "_init_threads", lambda: 1)
    one = models.init_params(CFG, jax.random.key(3), heads=("lm", "score"))
    jax.tree.map(np.testing.assert_array_equal, many, one)
    scanned = CFG.replace(scan_layers=True)
    jax.tree.map(np.testing.assert_array_equal,
                 models.init_params(scanned, jax.random.key(3)),
                 models.stack_layers(scanned, models.init_params(
                     CFG, jax.random.key(3))))

  @pytest.mark.parametrize("name,shape,fan_in", [
      ("o_kernel", (8, 16, 64), 128), ("q_kernel", (64, 8, 16), 64),
      ("down_kernel", (256, 32), 256)])
  def test_initial_value_statistics(self, name, shape, fan_in):
    value = transformer.initial_value(name, shape,
                                      np.random.default_rng(0))
    checked = [value]
    if name == "o_kernel":  # The jax initialiser follows the same table.
      checked.append(np.asarray(transformer.initializer(name)(
          jax.random.key(0), shape)))
    # Truncated at 2 standard deviations of the underlying normal, scaled so
    # that the variance is 1 / fan_in.
    bound = 2 / np.sqrt(fan_in) / 0.87962566103423978
    for x in checked:
      assert np.abs(x).max() <= bound + 1e-6
      np.testing.assert_allclose(x.std(), 1 / np.sqrt(fan_in), rtol=0.05)

  def test_tied_has_no_lm_head(self):
    p = models.init_params(TIED_CFG, jax.random.key(0))
    assert "lm_head" not in p and "q_bias" not in p["layers_0"]["attention"]

  def test_rejects_unknown_head(self):
    with pytest.raises(ValueError, match="Unknown head"):
      models.init_params(CFG, jax.random.key(0), heads=("lm", "value"))

  def test_logical_axes_match_params(self, params):
    specs = models.param_logical_axes(CFG, heads=("lm", "score"))
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
    assert (jax.tree.structure(specs, is_leaf=is_spec) ==
            jax.tree.structure(params))
    names = {v for k, v in vars(axes).items() if k.isupper()
             and isinstance(v, str)}
    for spec, leaf in zip(jax.tree.leaves(specs, is_leaf=is_spec),
                          jax.tree.leaves(params)):
      assert len(spec) == leaf.ndim
      assert all(name in names for name in spec)
    assert specs["layers_1"]["mlp"]["down_kernel"] == (
        jax.sharding.PartitionSpec(axes.MLP, axes.EMBED))
    assert specs["embed"] == jax.sharding.PartitionSpec(axes.VOCAB,
                                                        axes.EMBED)

  def test_init_from_backbone(self, params):
    value = models.init_from_backbone(CFG, params, jax.random.key(5))
    assert "lm_head" not in value and "score_kernel" in value
    for name in ("embed", "layers_0", "layers_1", "final_norm"):
      jax.tree.map(np.testing.assert_array_equal, value[name], params[name])
    assert not np.allclose(value["score_kernel"], params["score_kernel"])
    both = models.init_from_backbone(CFG, params, jax.random.key(5),
                                     heads=("lm", "score"))
    np.testing.assert_array_equal(both["lm_head"], params["lm_head"])


class TestForward:

  def test_matches_reference(self, params):
    hidden, ref_logits, ref_scores = reference_forward(
        CFG, params, TOKENS, MASK)
    del hidden
    logits, cache = models.apply(CFG, params, TOKENS, attention_mask=MASK)
    assert cache is None and logits.shape == (2, 7, VOCAB)
    valid = MASK.astype(bool)
    np.testing.assert_allclose(np.asarray(logits)[valid], ref_logits[valid],
                               atol=1e-5, rtol=1e-5)
    scores, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK,
                             head="score")
    assert scores.shape == (2, 7)
    np.testing.assert_allclose(np.asarray(scores)[valid], ref_scores[valid],
                               atol=1e-5, rtol=1e-5)

  def test_last_only(self, params):
    full, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK)
    last, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK,
                           last_only=True)
    assert last.shape == (2, 1, VOCAB)
    np.testing.assert_allclose(last, full[:, -1:], atol=1e-6)

  def test_tied_gqa_single_kv_head_matches_reference(self):
    p = models.init_params(TIED_CFG, jax.random.key(2))
    _, ref_logits, _ = reference_forward(TIED_CFG, p, TOKENS[:1], MASK[:1])
    np.testing.assert_allclose(models.logits(TIED_CFG, p, TOKENS[:1]),
                               ref_logits, atol=1e-5, rtol=1e-5)

  def test_left_padding_invariance(self, params):
    # Row 1 of TOKENS is row [4, 11, 2, 6] with 3 pads; compare with it alone.
    padded, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK)
    alone = models.logits(CFG, params, TOKENS[1:, 3:])
    np.testing.assert_allclose(padded[1, 3:], alone[0], atol=1e-5)

  def test_causal(self, params):
    changed = TOKENS.copy()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    a = models.logits(CFG, params, TOKENS)
    b = models.logits(CFG, params, changed)
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], atol=1e-6)
    assert not np.allclose(a[:, -1], b[:, -1])

  def test_bfloat16_activations_close_to_float32(self, params):
    # Log-probabilities of the left-padded batch, on its valid positions.
    # bfloat16 moves them by at most 0.054 here (0.04-0.18 over 5 random
    # initialisations); an attention mask or a position one slot off moves
    # them by 0.8-3.7 (checked below in float32, where nothing else moves).
    tolerance = 0.25

    def log_probs(cfg, mask=MASK, positions=None):
      out, _ = models.apply(cfg, params, TOKENS, attention_mask=mask,
                            positions=positions)
      assert out.dtype == jnp.float32
      return np.asarray(jax.nn.log_softmax(out, axis=-1))

    valid = MASK > 0
    lp32 = log_probs(CFG)
    error = np.abs(log_probs(CFG.replace(dtype="bfloat16")) - lp32)[valid]
    assert 0 < error.max() <= tolerance, error.max()
    # The tolerance tells a one-slot mistake apart: row 1 seeing one pad
    # slot, or the last token one position further.
    seen_pad = MASK.copy()
    seen_pad[1, 2] = 1
    positions = np.maximum(np.cumsum(MASK, axis=1) - 1, 0)
    np.testing.assert_array_equal(log_probs(CFG, positions=positions), lp32)
    positions[:, -1] += 1
    for shifted in (log_probs(CFG, mask=seen_pad),
                    log_probs(CFG, positions=positions)):
      assert np.abs(shifted - lp32)[valid].max() > 3 * tolerance

  def test_bad_inputs(self, params):
    with pytest.raises(ValueError, match="attention_mask"):
      models.apply(CFG, params, TOKENS, attention_mask=MASK[:, :3])
    with pytest.raises(ValueError, match=r"\[B, T\]"):
      models.apply(CFG, params, TOKENS[0])
    with pytest.raises(ValueError, match="Unknown head"):
      models.apply(CFG, params, TOKENS, head="value")
    with pytest.raises(ValueError, match="cache_index"):
      models.apply(CFG, params, TOKENS, cache_index=0)


class TestCache:

  def test_incremental_matches_full(self, params):
    full, _ = models.apply(CFG, params, TOKENS, attention_mask=MASK)
    cache = models.init_cache(CFG, 2, 10)
    assert not cache.stacked and len(cache.k) == CFG.num_layers
    # Head-major: [B, KVH, S, Dh].
    assert cache.k[0].shape == (2, CFG.num_kv_heads, 10, CFG.head_dim)
    assert cache.v[0].shape == (2, CFG.num_kv_heads, 10, CFG.head_dim)
    # Prefill 4 tokens at a static index, then one token at a time with a
    # traced index (the sampler's pattern).
    first, cache = models.apply(CFG, params, TOKENS[:, :4],
                                attention_mask=MASK[:, :4], cache=cache,
                                cache_index=0)
    valid = MASK[:, :4].astype(bool)
    np.testing.assert_allclose(np.asarray(first)[valid],
                               np.asarray(full[:, :4])[valid], atol=1e-5)
    step = jax.jit(lambda c, tok, m, i: models.apply(
        CFG, params, tok, attention_mask=m, cache=c, cache_index=i))
    for t in range(4, 7):
      out, cache = step(cache, TOKENS[:, t:t + 1], MASK[:, t:t + 1],
                        jnp.int32(t))
      np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-5)
    np.testing.assert_array_equal(cache.key_mask[:, :7], MASK.astype(bool))
    assert not cache.key_mask[:, 7:].any()

  def test_cache_skips_padding_slots(self, params):
    # Writing a pad slot in the middle of the cache must not change later
    # tokens: positions continue from the valid slots only.
    row = TOKENS[1:, 3:]  # 4 real tokens.
    full = models.logits(CFG, params, row)
    cache = models.init_cache(CFG, 1, 8)
    _, cache = models.apply(CFG, params, row[:, :2], cache=cache,
                            cache_index=0)
    _, cache = models.apply(CFG, params, np.array([[9]]),
                            attention_mask=np.array([[0]]), cache=cache,
                            cache_index=2)
    out, _ = models.apply(CFG, params, row[:, 2:], cache=cache,
                          cache_index=3)
    np.testing.assert_allclose(out[0], full[0, 2:], atol=1e-5)

  def test_cache_errors(self, params):
    cache = models.init_cache(CFG, 2, 4)
    with pytest.raises(ValueError, match="does not fit"):
      models.apply(CFG, params, TOKENS, cache=cache, cache_index=0)
    with pytest.raises(ValueError, match="batch size"):
      models.apply(CFG, params, TOKENS[:1, :2], cache=cache, cache_index=0)
    with pytest.raises(ValueError, match="needs cache_index"):
      models.apply(CFG, params, TOKENS[:, :2], cache=cache)


class TestTokenLogprobs:

  def test_matches_log_softmax_of_logits(self, params):
    out = np.asarray(models.token_logprobs(CFG, params, TOKENS, MASK))
    logits = np.asarray(models.apply(CFG, params, TOKENS,
                                     attention_mask=MASK)[0], np.float64)
    expected = np.zeros(TOKENS.shape)
    for b in range(2):
      for t in range(1, 7):
        if MASK[b, t] and MASK[b, t - 1]:
          row = logits[b, t - 1]
          log_z = np.log(np.sum(np.exp(row - row.max()))) + row.max()
          expected[b, t] = row[TOKENS[b, t]] - log_z
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # Entry 0, padding, and the first real token of row 1 are exactly 0.
    assert out[0, 0] == 0 and not out[1, :4].any()
    assert (out[0, 1:] < 0).all()

  def test_temperature(self, params):
    hot = models.token_logprobs(CFG, params, TOKENS, MASK, temperature=2.0)
    logits = models.apply(CFG, params, TOKENS, attention_mask=MASK)[0] / 2.0
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]),
                                   TOKENS[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(hot[0, 1:], expected[0], atol=1e-5)


class TestSharding:

  def test_sharded_init_and_forward(self, params):
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]).reshape(2, 2, 2), axes.MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * 3)
    specs = models.param_logical_axes(CFG, heads=("lm", "score"))
    # The test vocabulary (13) does not divide the mesh: replicate it.
    rules = tuple((name, None if name in (axes.VOCAB, axes.ACT_VOCAB) else rule)
                  for name, rule in axes.DEFAULT_RULES)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    sharded = jax.device_put(params, shardings)
    q = sharded["layers_0"]["attention"]["q_kernel"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(
        axes.FSDP, axes.TENSOR, None)
    tokens = np.tile(TOKENS, (2, 1))
    mask = np.tile(MASK, (2, 1))
    with nn.logical_axis_rules(rules), jax.set_mesh(mesh):
      out = models.token_logprobs(CFG, sharded, tokens, mask)
    np.testing.assert_allclose(
        out, models.token_logprobs(CFG, params, tokens, mask), atol=1e-5)


def test_rope_table_is_computed_once_per_pass():
  """The RoPE cos/sin table is evaluated once in a forward and backward pass
  on a CPU, not in every query and key fusion of every layer
  (`matmul.computed_once`), and it is still cos and sin of the angles."""
  if jax.default_backend() != "cpu":
    pytest.skip("the fusion boundary is a CPU-backend measure")
  cfg = models.preset("tiny", 18)
  p = models.init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(1, 18, (2, 16)),
                       jnp.int32)
  grad = jax.jit(jax.grad(
      lambda q: models.token_logprobs(cfg, q, tokens).sum()))
  text = grad.lower(p).compile().as_text()
  assert text.count("cosine(") == 1 and text.count(" sine(") == 1
  positions = jnp.arange(16)[None] * jnp.ones((2, 1), jnp.int32)
  table = jax.jit(lambda pos: transformer.rope_table(
      pos, cfg.head_dim, cfg.rope_theta, None, jnp.float32))(positions)
  inv_freq, _ = transformer.rope_frequencies(cfg.head_dim, cfg.rope_theta,
                                             None)
  angles = np.asarray(positions, np.float32)[..., None] * inv_freq
  angles = np.concatenate([angles, angles], -1)[:, :, None]
  np.testing.assert_allclose(table.cos, np.cos(angles), rtol=0, atol=1e-6)
  np.testing.assert_allclose(table.sin, np.sin(angles), rtol=0, atol=1e-6)
