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
from rl_rewards.models import hf
from rl_rewards.sharding import axes

CFG = models.preset("test", 16)


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
    with pytest.raises(ValueError, match="llama3"):
      hf.config_from_hf(config)

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
