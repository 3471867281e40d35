"""Checkpoint I/O tests that need no PyTorch: layouts, round trips, errors."""

import json
import os

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from rl_rewards import models
from rl_rewards.models import config as config_lib
from rl_rewards.models import hf
from rl_rewards.models import transformer
from rl_rewards.sharding import axes

CFG = models.preset("test", 16)
_GEMMA = dict(
    architecture="gemma3_text", attention_bias=False, qk_norm=True,
    norm_placement="sandwich", rms_scale_offset=1.0,
    mlp_activation="gelu_tanh", embed_scale=32 ** 0.5,
    query_pre_attn_scalar=8.0, tie_word_embeddings=True, rope_theta=1e6,
    local_rope_theta=1e4, num_layers=3,
    layer_types=("sliding", "full", "sliding"), sliding_window=4)
# One config per family, as its config.json reader produces them.
FAMILIES = {
    "qwen2": CFG.replace(rope_scaling=config_lib.RopeScaling(
        "yarn", 4.0, original_max_position_embeddings=64,
        attention_factor=transformer.yarn_attention_factor(4.0))),
    "qwen3": CFG.replace(architecture="qwen3", attention_bias=False,
                         qk_norm=True, head_dim=16),
    "llama": CFG.replace(architecture="llama", attention_bias=False,
                         rope_scaling=config_lib.RopeScaling(
                             "llama3", 8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0,
                             original_max_position_embeddings=64)),
    "mistral": CFG.replace(architecture="mistral", attention_bias=False,
                           layer_types=("sliding", "sliding"),
                           sliding_window=6),
    "gemma3_text": CFG.replace(**_GEMMA),
}


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0), heads=("lm", "score"))


def _read(path):
  with open(path, "rb") as f:
    return f.read()


def test_save_load_save_is_bit_identical(tmp_path, params):
  models.save_hf(str(tmp_path / "a"), CFG, params)
  cfg, loaded = models.load_hf(str(tmp_path / "a"))
  assert cfg == CFG
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  models.save_hf(str(tmp_path / "b"), cfg, loaded)
  for name in ("config.json", "model.safetensors"):
    assert _read(tmp_path / "a" / name) == _read(tmp_path / "b" / name)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_save_load_save_is_bit_identical(tmp_path, params, remat):
  cfg = CFG.replace(scan_layers=True, remat=remat)
  stacked = models.stack_layers(CFG, params)
  models.save_hf(str(tmp_path / "a"), cfg, stacked)
  # The files do not depend on the layout.
  models.save_hf(str(tmp_path / "flat"), CFG, params)
  assert (_read(tmp_path / "a" / "model.safetensors") ==
          _read(tmp_path / "flat" / "model.safetensors"))
  loaded_cfg, loaded = models.load_hf(str(tmp_path / "a"), scan_layers=True,
                                      remat=remat)
  assert loaded_cfg == cfg
  assert loaded["layers"]["attention"]["q_kernel"].shape == (
      CFG.num_layers, 32, 4, 8)
  jax.tree.map(np.testing.assert_array_equal, loaded, stacked)
  models.save_hf(str(tmp_path / "b"), loaded_cfg, loaded)
  for name in ("config.json", "model.safetensors"):
    assert _read(tmp_path / "a" / name) == _read(tmp_path / "b" / name)


def test_save_rejects_params_in_the_other_layout(tmp_path, params):
  with pytest.raises(ValueError, match="stack_layers"):
    models.save_hf(str(tmp_path), CFG.replace(scan_layers=True), params)
  with pytest.raises(ValueError, match="unstack_layers"):
    models.save_hf(str(tmp_path), CFG, models.stack_layers(CFG, params))


def test_config_from_hf_takes_run_settings():
  config = hf.config_to_hf(CFG)
  cfg = hf.config_from_hf(config, dtype="bfloat16", scan_layers=True,
                          remat="dots")
  assert cfg == CFG.replace(dtype="bfloat16", scan_layers=True, remat="dots")
  assert "scan_layers" not in config and "remat" not in config
  with pytest.raises(ValueError, match="remat"):
    hf.config_from_hf(config, remat="everything")


def test_hf_layout(tmp_path, params):
  """Spot-checks names and transposes against HF's [out, in] convention."""
  models.save_hf(str(tmp_path), CFG, params)
  tensors = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
  d, dh = CFG.hidden_size, CFG.head_dim
  q = tensors["model.layers.1.self_attn.q_proj.weight"]
  assert q.shape == (CFG.num_heads * dh, d)
  # Row n * Dh + j of q_proj is output feature (head n, dim j).
  kernel = np.asarray(params["layers_1"]["attention"]["q_kernel"])
  np.testing.assert_array_equal(q[3 * dh + 5], kernel[:, 3, 5])
  o = tensors["model.layers.0.self_attn.o_proj.weight"]
  o_kernel = np.asarray(params["layers_0"]["attention"]["o_kernel"])
  np.testing.assert_array_equal(o[:, 2 * dh + 1], o_kernel[2, 1])
  np.testing.assert_array_equal(tensors["lm_head.weight"],
                                np.asarray(params["lm_head"]).T)
  np.testing.assert_array_equal(
      tensors["model.layers.0.mlp.down_proj.weight"],
      np.asarray(params["layers_0"]["mlp"]["down_kernel"]).T)
  assert "o_proj.bias" not in " ".join(tensors)
  config = json.loads(_read(tmp_path / "config.json"))
  assert config["model_type"] == "qwen2"
  assert config["architectures"] == ["Qwen2ForCausalLM"]
  assert config["num_key_value_heads"] == CFG.num_kv_heads


def test_sharded_checkpoint_and_bfloat16(tmp_path, params):
  """Index-sharded bf16 files load as float32, each tensor from its file."""
  models.save_hf(str(tmp_path), CFG, params)
  tensors = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
  os.remove(tmp_path / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  weight_map = {}
  for file, shard_names in shards.items():
    safetensors_numpy.save_file(
        {n: tensors[n].astype(ml_dtypes.bfloat16) for n in shard_names},
        str(tmp_path / file))
    weight_map.update({n: file for n in shard_names})
  with open(tmp_path / "model.safetensors.index.json", "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  _, loaded = models.load_hf(str(tmp_path), dtype="bfloat16")
  expected = jax.tree.map(
      lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32),
      params)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)


def test_tied_llama_round_trip(tmp_path):
  cfg = CFG.replace(architecture="llama", attention_bias=False,
                    tie_word_embeddings=True, head_dim=4)
  p = models.init_params(cfg, jax.random.key(1))
  models.save_hf(str(tmp_path), cfg, p)
  tensors = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
  assert "lm_head.weight" not in tensors
  assert "model.layers.0.self_attn.q_proj.bias" not in tensors
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (16, 32)
  cfg2, p2 = models.load_hf(str(tmp_path))
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, p2, p)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_load_into_shardings(tmp_path, params, scan_layers):
  cfg = CFG.replace(scan_layers=scan_layers)
  models.save_hf(str(tmp_path), CFG, params)
  mesh = jax.sharding.Mesh(
      np.array(jax.devices()[:8]).reshape(2, 2, 2), axes.MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * 3)
  specs = models.param_logical_axes(cfg, heads=("lm", "score"))
  shardings = nn.logical_to_mesh_sharding(specs, mesh, axes.DEFAULT_RULES)
  _, loaded = models.load_hf(str(tmp_path), shardings=shardings,
                             scan_layers=scan_layers)
  embed = loaded["embed"]
  assert embed.sharding == shardings["embed"]
  assert embed.addressable_shards[0].data.shape == (8, 16)
  expected = models.stack_layers(CFG, params) if scan_layers else params
  jax.tree.map(np.testing.assert_array_equal, loaded, expected)
  if scan_layers:
    # [L, D, F]: layers replicated, D over fsdp, F over tensor.
    gate = loaded["layers"]["mlp"]["gate_kernel"]
    assert gate.sharding == shardings["layers"]["mlp"]["gate_kernel"]
    assert gate.addressable_shards[0].data.shape == (2, 16, 32)


class TestErrors:

  def test_missing_config(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
      models.load_hf(str(tmp_path))

  def test_missing_weights(self, tmp_path):
    with open(tmp_path / "config.json", "w") as f:
      json.dump(hf.config_to_hf(CFG), f)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
      models.load_hf(str(tmp_path))

  def test_unsupported_model_type(self, tmp_path):
    config = hf.config_to_hf(CFG)
    config["model_type"] = "gpt2"
    with open(tmp_path / "config.json", "w") as f:
      json.dump(config, f)
    with pytest.raises(ValueError, match="gpt2"):
      models.load_hf(str(tmp_path))

  def test_unsupported_rope_scaling(self):
    config = hf.config_to_hf(CFG)
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5}
    with pytest.raises(ValueError, match="llama3.*missing key 'factor'"):
      hf.config_from_hf(config)
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(ValueError, match=r"rope_parameters: rope type "
                                         r"'dynamic' is not supported"):
      hf.config_from_hf(config)
    config["rope_parameters"] = {"rope_type": "default",
                                 "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
      hf.config_from_hf(config)

  @pytest.mark.parametrize("model_type,change,key", [
      ("llama", {"mlp_bias": True}, "mlp_bias=true"),
      ("llama", {"attention_bias": True}, "attention_bias=true"),
      ("qwen3", {"attention_bias": True}, "attention_bias=true"),
      ("mistral", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
      ("gemma3_text", {"final_logit_softcapping": 30.0},
       "final_logit_softcapping=30.0"),
      ("gemma3_text", {"attn_logit_softcapping": 50.0},
       "attn_logit_softcapping=50.0"),
      ("gemma3_text", {"use_bidirectional_attention": True},
       "use_bidirectional_attention=true"),
      ("gemma3_text", {"hidden_activation": "gelu"}, "hidden_activation"),
      ("gemma3_text", {"rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
       "rope_parameters.sliding_attention"),
      ("gemma3_text", {"layer_types": ["full_attention"]}, "layer_types"),
  ])
  def test_unsupported_feature_names_the_key(self, model_type, change, key):
    config = hf.config_to_hf(FAMILIES[model_type])
    config.update(change)
    with pytest.raises(ValueError, match=r"config\.json: .*" +
                       key.replace("(", r"\(").replace(".", r"\.")):
      hf.config_from_hf(config)

  def test_save_refuses_what_the_model_type_cannot_express(self, tmp_path):
    cfg = CFG.replace(architecture="llama", attention_bias=False,
                      qk_norm=True)
    with pytest.raises(ValueError, match=r"'llama' cannot express.*qk_norm"):
      models.save_hf(str(tmp_path), cfg,
                     models.init_params(cfg, jax.random.key(0)))

  def test_missing_tensor_names_file(self, tmp_path, params):
    models.save_hf(str(tmp_path), CFG, params)
    path = str(tmp_path / "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    safetensors_numpy.save_file(tensors, path)
    with pytest.raises(ValueError, match=r"model\.safetensors.*up_proj"):
      models.load_hf(str(tmp_path))

  def test_wrong_shape(self, tmp_path, params):
    models.save_hf(str(tmp_path), CFG, params)
    path = str(tmp_path / "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    tensors["model.norm.weight"] = np.ones(3, np.float32)
    safetensors_numpy.save_file(tensors, path)
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*\(3,\)"):
      models.load_hf(str(tmp_path))

  def test_missing_shard_file(self, tmp_path):
    with open(tmp_path / "config.json", "w") as f:
      json.dump(hf.config_to_hf(CFG), f)
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
      json.dump({"weight_map": {"model.norm.weight": "gone.safetensors"}}, f)
    with pytest.raises(FileNotFoundError, match="gone.safetensors"):
      models.load_hf(str(tmp_path))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("scan_layers", [False, True])
def test_every_family_round_trips(tmp_path, family, scan_layers):
  cfg = FAMILIES[family].replace(scan_layers=scan_layers)
  params = models.init_params(cfg, jax.random.key(2), heads=("lm", "score"))
  models.save_hf(str(tmp_path / "a"), cfg, params)
  config = json.loads(_read(tmp_path / "a" / "config.json"))
  assert config["model_type"] == family
  assert config["architectures"] == [hf._HF_ARCHITECTURES[family]]
  loaded_cfg, loaded = models.load_hf(str(tmp_path / "a"),
                                      scan_layers=scan_layers)
  assert loaded_cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  models.save_hf(str(tmp_path / "b"), loaded_cfg, loaded)
  for name in ("config.json", "model.safetensors"):
    assert _read(tmp_path / "a" / name) == _read(tmp_path / "b" / name)
  tensors = safetensors_numpy.load_file(
      str(tmp_path / "a" / "model.safetensors"))
  layer = "model.layers.0."
  assert (f"{layer}self_attn.q_norm.weight" in tensors) == cfg.qk_norm
  assert (f"{layer}pre_feedforward_layernorm.weight" in tensors) == (
      cfg.norm_placement == "sandwich")
  assert models.num_params(cfg, heads=("lm", "score")) == sum(
      x.size for x in jax.tree.leaves(params))


def test_legacy_and_new_rope_spellings_agree():
  """Hub (rope_theta + rope_scaling, `type` or `rope_type`) == 5.x form."""
  llama = hf.config_to_hf(FAMILIES["llama"])
  legacy = dict(llama, rope_scaling={
      "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
  del legacy["rope_parameters"]
  new = dict(llama)
  del new["rope_scaling"]
  assert hf.config_from_hf(legacy) == hf.config_from_hf(new) == (
      FAMILIES["llama"])
  # YaRN without attention_factor: transformers' default 0.1 ln(4) + 1.
  qwen = hf.config_to_hf(FAMILIES["qwen2"])
  del qwen["rope_parameters"]
  qwen["rope_scaling"] = {"type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 64}
  scaling = hf.config_from_hf(qwen).rope_scaling
  assert scaling.attention_factor == pytest.approx(1.1386294361119891)
  # Gemma 3 hub form: sliding_window_pattern instead of layer_types.
  gemma = hf.config_to_hf(FAMILIES["gemma3_text"])
  for key in ("layer_types", "rope_parameters"):
    del gemma[key]
  gemma["sliding_window_pattern"] = 2
  assert hf.config_from_hf(gemma) == FAMILIES["gemma3_text"]


def test_rope_frequencies_by_hand():
  # Dh = 8, theta = 1e4: f = [1, 0.1, 0.01, 0.001], wavelengths 2π/f =
  # [6.28, 62.8, 628, 6283].
  base, _ = transformer.rope_frequencies(8, 1e4)
  np.testing.assert_allclose(base, [1, 0.1, 0.01, 0.001], rtol=1e-6)
  linear, factor = transformer.rope_frequencies(
      8, 1e4, config_lib.RopeScaling("linear", 4.0))
  np.testing.assert_allclose(linear, base / 4, rtol=1e-6)
  assert factor == 1.0
  # llama3, original 256, low 1, high 8: wavelengths below 32 kept, above
  # 256 divided by 8, 62.8 smoothed with s = (256/62.83 - 1) / 7 = 0.43920:
  # (1 - s) * 0.1 / 8 + s * 0.1 = 0.050930.
  llama3, _ = transformer.rope_frequencies(8, 1e4, config_lib.RopeScaling(
      "llama3", 8.0, low_freq_factor=1.0, high_freq_factor=8.0,
      original_max_position_embeddings=256))
  np.testing.assert_allclose(llama3, [1, 0.050930, 0.01 / 8, 0.001 / 8],
                             rtol=1e-4)
  # yarn, factor 4, original 64, beta 32 / 1: correction dims
  # 8 ln(64 / (2π·32)) / (2 ln 1e4) = -0.1244 -> floor 0 and
  # 8 ln(64 / 2π) / (2 ln 1e4) = 1.0077 -> ceil 2; ramp (i - 0) / 2 over
  # i = 0..3 = [0, 0.5, 1, 1]: f_i (1 - ramp) + f_i / 4 · ramp.
  yarn, factor = transformer.rope_frequencies(8, 1e4, config_lib.RopeScaling(
      "yarn", 4.0, original_max_position_embeddings=64,
      attention_factor=1.25))
  np.testing.assert_allclose(
      yarn, [1, 0.05 + 0.0125, 0.0025, 0.00025], rtol=1e-5)
  assert factor == 1.25
  assert transformer.yarn_attention_factor(4.0) == pytest.approx(
      0.1 * np.log(4.0) + 1)
  # DeepSeek-style mscale terms: (0.1·1·ln 4 + 1) / (0.1·0.5·ln 4 + 1).
  assert transformer.yarn_attention_factor(4.0, 1.0, 0.5) == pytest.approx(
      (0.1 * np.log(4) + 1) / (0.05 * np.log(4) + 1))
  assert transformer.yarn_attention_factor(1.0) == 1.0


def test_qwen_sliding_windows_follow_use_sliding_window():
  config = hf.config_to_hf(CFG)
  config.update(sliding_window=4, max_window_layers=1)
  assert hf.config_from_hf(config).layer_types is None  # Not switched on.
  config["use_sliding_window"] = True
  cfg = hf.config_from_hf(config)
  assert cfg.layer_kinds == ("full", "sliding") and cfg.sliding_window == 4
  config["layer_types"] = ["sliding_attention", "full_attention"]
  cfg = hf.config_from_hf(config)
  assert cfg.layer_kinds == ("sliding", "full")
  assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg
