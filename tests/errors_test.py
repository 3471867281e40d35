"""The bad-input table of docs/errors.md: every row's error, and no damage.

Each test feeds one kind of bad input and checks the error type, that the
message names the key, file or line at fault, and, where something was saved
before (a checkpoint, a label set, a workdir, an exported model), that it is
unchanged and still loads. The full disk is simulated: the write fails with
ENOSPC part-way through.
"""

import errno
import hashlib
import json
import os
import re
import shutil

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy
from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers

from rl_rewards import checkpoints
from rl_rewards import config_lib
from rl_rewards import config_presets
from rl_rewards import errors
from rl_rewards import models
from rl_rewards.data import jsonl
from rl_rewards.models import hf
from rl_rewards.prm import label_store
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages
from rl_rewards.runners import sft

CFG = models.preset("test", 16)


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0))


def _config(**overrides):
  config = config_presets.apply_size(config_lib.base_config(), "test")
  for key, value in overrides.items():
    section, name = key.rsplit(".", 1)
    config[section][name] = value
  return config


def _digests(directory) -> dict:
  """{relative path: sha256} of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def _disk_full(path):
  return OSError(errno.ENOSPC, "No space left on device", str(path))


# ------------------------------------------------------------- config, mesh --


def test_mesh_sizes_that_do_not_match_the_devices(tmp_path):
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.mesh: axis sizes .*'data': 3.* multiply "
                           r"to 3, but 8 devices"):
    pipeline.build_context(_config(**{"mesh.data": 3}), str(tmp_path))


def test_parameter_dimension_that_does_not_divide_the_mesh(tmp_path):
  # The arithmetic vocabulary has 18 tokens and the test model 2 KV heads;
  # a 4-way tensor axis splits neither.
  config = _config(**{"mesh.data": 2, "mesh.tensor": 4})
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.mesh\.tensor: tensor=4 splits dimension "
                           r"0 \('vocab', size 18\) of parameter embed "
                           r"\(18, 32\) into 4 parts"):
    pipeline.build_context(config, str(tmp_path))
  config.mesh.rules = "vocab=none"
  with pytest.raises(config_lib.ConfigError,
                     match=r"\('kv_heads', size 2\) of parameter layers_0/"
                           r"attention/\w+"):
    pipeline.build_context(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "config.json")
  # Rules that keep both whole make the same mesh valid.
  config.mesh.rules = "vocab=none,kv_heads=none"
  pipeline.build_context(config, str(tmp_path / "ok"))


def test_workdir_holding_another_config_is_left_as_it_was(tmp_path):
  workdir = str(tmp_path)
  pipeline.build_context(_config(), workdir)
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", "sft"))
  ckpt.save(2, {"w": jnp.arange(6.0)}, {"step": 2})
  ckpt.close()
  before = _digests(workdir)
  with pytest.raises(config_lib.ConfigError,
                     match=rf"workdir {re.escape(workdir)} holds a run with a "
                           r"different config \(changed: rl\.learning_rate, "
                           r"sft\.batch_size\)"):
    pipeline.build_context(
        _config(**{"rl.learning_rate": 1.0, "sft.batch_size": 8}), workdir)
  assert _digests(workdir) == before
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", "sft"))
  state, meta = ckpt.restore({"w": jnp.zeros(6)})
  np.testing.assert_array_equal(state["w"], np.arange(6.0))
  assert meta == {"step": 2}


# ------------------------------------------------------ checkpoints, orbax --


def test_checkpoint_of_another_shape_names_the_checkpoint(tmp_path):
  directory = str(tmp_path / "ckpt")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(3, {"params": {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}}, {})
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(directory)}/3: the checkpoint does "
                           r"not match .* params/w has shape \(4, 3\) in the "
                           r"checkpoint, \(5, 3\) here"):
    ckpt.restore({"params": {"w": jnp.ones((5, 3)), "b": jnp.zeros(3)}})
  with pytest.raises(errors.InputError,
                     match=r"not in the checkpoint: params/c; only in the "
                           r"checkpoint: params/b"):
    ckpt.restore({"params": {"w": jnp.ones((4, 3)), "c": jnp.zeros(3)}})
  state, _ = ckpt.restore({"params": {"w": jnp.zeros((4, 3)),
                                      "b": jnp.ones(3)}})
  np.testing.assert_array_equal(state["params"]["w"], np.ones((4, 3)))


def test_init_from_a_run_with_another_model(tmp_path):
  # A finished SFT stage of a run whose model is the `tiny` preset.
  other = str(tmp_path / "other")
  tiny = models.preset("tiny", 16)
  ckpt = checkpoints.Checkpointer(os.path.join(other, "checkpoints", "sft"))
  ckpt.save(5, {"params": models.init_params(tiny, jax.random.key(1)),
                "step": jnp.int32(5)}, {})
  ckpt.mark_done(5, {"eval/accuracy": 0.5})
  ckpt.close()
  before = _digests(other)
  ctx = pipeline.build_context(_config(**{"sft.init_from": other}),
                               str(tmp_path / "run"))
  with pytest.raises(config_lib.ConfigError,
                     match=rf"config\.sft\.init_from: {re.escape(other)}: the "
                           r"saved parameters do not fit this run's model .*"
                           r"embed has shape \(16, 128\), this model needs "
                           r"\(\d+, 32\)"):
    sft.load_finished(ctx, other)
  assert _digests(other) == before


def test_disk_full_during_a_checkpoint_save(tmp_path, monkeypatch):
  directory = str(tmp_path / "ckpt")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(1, {"w": jnp.full((4, 3), 1.0)}, {"step": 1})
  original = epath.Path.write_text

  def write_text(self, *args, **kwargs):
    # The arrays of step 2 are written; its metadata no longer fits.
    if "2.orbax-checkpoint-tmp/state" in str(self):
      raise _disk_full(self)
    return original(self, *args, **kwargs)

  monkeypatch.setattr(epath.Path, "write_text", write_text)
  with pytest.raises(OSError, match=rf"disk full while writing "
                                    rf"{re.escape(directory)}/2; the latest "
                                    r"complete checkpoint \(step 1\) is "
                                    r"intact") as raised:
    ckpt.save(2, {"w": jnp.full((4, 3), 2.0)}, {"step": 2})
  assert raised.value.errno == errno.ENOSPC
  monkeypatch.undo()
  assert sorted(os.listdir(directory)) == ["1"]  # Partial files removed.
  again = checkpoints.Checkpointer(directory)
  assert again.latest_step() == 1
  state, meta = again.restore({"w": jnp.zeros((4, 3))})
  np.testing.assert_array_equal(state["w"], np.ones((4, 3)))
  assert meta == {"step": 1}
  # Once there is room again, the run goes on.
  again.save(2, {"w": jnp.full((4, 3), 2.0)}, {"step": 2})
  assert again.latest_step() == 2



def test_chunks_landing_after_a_failed_save_are_removed(tmp_path,
                                                        monkeypatch):
  # Orbax raises at the first failed write while tensorstore may still be
  # writing array chunks of the same save: here one lands just after the
  # partial directory is first removed.
  directory = str(tmp_path / "ckpt")
  ckpt = checkpoints.Checkpointer(directory)
  ckpt.save(1, {"w": jnp.full((4, 3), 1.0)}, {"step": 1})
  original_write, original_rmtree = epath.Path.write_text, shutil.rmtree
  landed = []

  def write_text(self, *args, **kwargs):
    if "2.orbax-checkpoint-tmp/state" in str(self):
      raise _disk_full(self)
    return original_write(self, *args, **kwargs)

  def rmtree(path, *args, **kwargs):
    original_rmtree(path, *args, **kwargs)
    if not landed and ".orbax-checkpoint-tmp" in os.path.basename(path):
      chunk = os.path.join(path, "state.orbax-checkpoint-tmp", "d")
      os.makedirs(chunk)
      with open(os.path.join(chunk, "late_chunk"), "w") as f:
        f.write("x")
      landed.append(path)

  monkeypatch.setattr(epath.Path, "write_text", write_text)
  monkeypatch.setattr(checkpoints.shutil, "rmtree", rmtree)
  with pytest.raises(OSError, match="disk full while writing"):
    ckpt.save(2, {"w": jnp.full((4, 3), 2.0)}, {"step": 2})
  assert landed  # The late chunk did land after the first removal.
  assert sorted(os.listdir(directory)) == ["1"]

# ------------------------------------------------- HF checkpoints, tokenizer --


def _export(tmp_path, params):
  path = str(tmp_path / "model")
  models.save_hf(path, CFG, params)
  return path


@pytest.mark.parametrize("keep", [0, 5, 0.5, -4])
def test_truncated_safetensors_names_the_file(tmp_path, params, keep):
  path = _export(tmp_path, params)
  weights = os.path.join(path, "model.safetensors")
  with open(weights, "rb") as f:
    data = f.read()
  keep = int(len(data) * keep) if isinstance(keep, float) else keep
  with open(weights, "wb") as f:
    f.write(data[:keep])
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(weights)}: not a readable "
                           r"safetensors file \(truncated or corrupt\?\)"):
    models.load_hf(path)


def test_index_listing_a_tensor_in_the_wrong_shard(tmp_path, params):
  path = _export(tmp_path, params)
  tensors = safetensors_numpy.load_file(os.path.join(path,
                                                     "model.safetensors"))
  os.remove(os.path.join(path, "model.safetensors"))
  names = sorted(tensors)
  safetensors_numpy.save_file({n: tensors[n] for n in names[:4]},
                              os.path.join(path, "a.safetensors"))
  safetensors_numpy.save_file({n: tensors[n] for n in names[4:]},
                              os.path.join(path, "b.safetensors"))
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {n: "a.safetensors" for n in names}}, f)
  with pytest.raises(errors.InputError,
                     match=r"a\.safetensors: cannot read tensor '[\w.]+' "
                           r"\(listed for it in .*model\.safetensors\.index"
                           r"\.json\)"):
    models.load_hf(path)


def test_integer_weights_are_rejected(tmp_path, params):
  path = _export(tmp_path, params)
  weights = os.path.join(path, "model.safetensors")
  tensors = safetensors_numpy.load_file(weights)
  tensors["model.norm.weight"] = np.ones(32, np.int32)
  safetensors_numpy.save_file(tensors, weights)
  with pytest.raises(errors.InputError,
                     match=r"model\.safetensors: tensor 'model\.norm\.weight' "
                           r"has dtype int32"):
    models.load_hf(path)


@pytest.mark.parametrize("change,message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0},
      "rope_parameters": None},
     "rope_scaling: rope type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e6}},
     "rope_parameters: rope type 'longrope' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6}},
     r"rope_parameters: rope type 'llama3': missing key 'factor'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"hidden_size": "big"}, "'hidden_size' must be an integer, got 'big'"),
    ({"num_hidden_layers": 2.5}, "'num_hidden_layers' must be an integer"),
    ({"vocab_size": None}, "missing key 'vocab_size'"),
    ({"num_attention_heads": 5},
     r"ModelConfig\.num_heads \(5\) must be a multiple"),
])
def test_unsupported_hf_config_names_the_file(tmp_path, params, change,
                                              message):
  path = _export(tmp_path, params)
  config_path = os.path.join(path, "config.json")
  with open(config_path) as f:
    config = json.load(f)
  config.update(change)
  with open(config_path, "w") as f:
    json.dump(config, f)
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(config_path)}: {message}"):
    models.load_hf(path)


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"model_type": "qwen2",', "invalid JSON"),
    (b"\xff\xfe{}", "invalid JSON"),
])
def test_malformed_hf_config_names_the_file(tmp_path, params, text, message):
  path = _export(tmp_path, params)
  config_path = os.path.join(path, "config.json")
  with open(config_path, "wb") as f:
    f.write(text if isinstance(text, bytes) else text.encode())
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(config_path)}: {message}"):
    models.load_hf(path)


def test_disk_full_during_save_hf_keeps_the_earlier_export(tmp_path, params,
                                                           monkeypatch):
  path = _export(tmp_path, params)
  before = _digests(path)
  original = safetensors_numpy.save_file

  def save_file(tensors, filename, metadata=None):
    original(tensors, filename, metadata=metadata)
    with open(filename, "r+b") as f:  # Half of it made it to the disk.
      f.truncate(os.path.getsize(filename) // 2)
    raise _disk_full(filename)

  monkeypatch.setattr(hf.safetensors_numpy, "save_file", save_file)
  other = jax.tree.map(lambda x: x + 1.0, params)
  with pytest.raises(OSError, match=rf"disk full while writing "
                                    rf"{re.escape(path)}; files already "
                                    "there are unchanged"):
    models.save_hf(path, CFG, other)
  assert _digests(path) == before  # No temporary files left either.
  _, loaded = models.load_hf(path)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def _tokenizer_file(directory, num_words):
  vocab = {"<|endoftext|>": 0, "<unk>": 1}
  vocab.update({f"w{i}": i + 2 for i in range(num_words - 2)})
  tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  path = os.path.join(directory, "tokenizer.json")
  tokenizer.save(path)
  return path


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path, params):
  path = _export(tmp_path, params)  # vocab_size 16
  tokenizer = _tokenizer_file(str(tmp_path), 40)
  config = _config(**{"task.name": "gsm8k", "model.hf_path": path,
                      "model.tokenizer_path": tokenizer,
                      "task.train_path": str(tmp_path / "train.jsonl"),
                      "task.eval_path": str(tmp_path / "eval.jsonl")})
  with pytest.raises(config_lib.ConfigError,
                     match=rf"config\.model\.tokenizer_path: the tokenizer "
                           rf"{re.escape(tokenizer)} has 40 tokens, more than "
                           rf"the vocabulary of the model \("
                           rf"{re.escape(path)}/config\.json: vocab_size 16\)"):
    pipeline.build_context(config, str(tmp_path / "run"))
  # Checked before any data is prepared (the JSONL files do not exist).
  assert not os.path.exists(tmp_path / "run" / "data")


# --------------------------------------------------------------- JSONL data --


def _gsm8k_line(i):
  return json.dumps({"question": f"Q{i}", "answer": f"#### {i}"})


def test_jsonl_that_is_not_utf8_names_file_and_line(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_bytes((_gsm8k_line(0) + "\n").encode() +
                   b'{"question": "caf\xe9", "answer": "#### 1"}\n')
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(str(path))}:2: not UTF-8 "
                           r"\(byte 18 of the line: b'\\xe9'\)"):
    jsonl.read_gsm8k_jsonl(str(path))


def test_jsonl_cut_off_mid_record_names_file_and_line(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text(_gsm8k_line(0) + "\n" + _gsm8k_line(1) + "\n" +
                  _gsm8k_line(2)[:20])
  with pytest.raises(errors.InputError,
                     match=rf"{re.escape(str(path))}:3: invalid JSON"):
    jsonl.read_gsm8k_jsonl(str(path))


# -------------------------------------------------------------- label sets --


def _record(index):
  return {
      "split": "train", "index": index, "question": "23+07=",
      "prompt_ids": [1, 5, 6], "response_ids": [7, 8, 2], "text": "1\n2",
      "finished": True, "outcome": 1.0, "q": [0.5, 1.0], "hard": [1, 1],
      "rollouts": [4, 0], "v": 0.25, "v_rollouts": 4, "oracle": None,
      "first_error": None}


def _label_set(directory, num_shards=2, per_shard=2, **manifest):
  """Writes a complete label set; `manifest` overrides manifest fields."""
  for shard in range(num_shards):
    label_store.write_shard(directory, shard, [
        _record(shard * per_shard + i) for i in range(per_shard)])
  info = {"num_shards": num_shards, "num_solutions": num_shards * per_shard}
  info.update({k.replace("manifest_", ""): v for k, v in manifest.items()})
  label_store.write_manifest(directory, info)


@pytest.mark.parametrize("setup,message", [
    (lambda d: _label_set(d, num_solutions=5),
     r"manifest\.json: the manifest counts 5 solutions, but its 2 shards "
     r"hold 4"),
    (lambda d: (_label_set(d), label_store.write_shard(d, 7, [_record(9)])),
     r"manifest\.json: the manifest lists 2 shards, but .*shard-00007\.jsonl "
     r"is also there"),
    (lambda d: _label_set(d, manifest_num_shards=3),
     r"shard 2 is missing \(.*shard-00002\.jsonl\)"),
    (lambda d: _label_set(d, manifest_num_shards="two"),
     r"manifest\.json: num_shards must be a positive integer, got 'two'"),
])
def test_label_set_whose_manifest_disagrees_with_its_shards(tmp_path, setup,
                                                            message):
  directory = str(tmp_path / "labels")
  setup(directory)
  before = _digests(directory)
  with pytest.raises(errors.InputError, match=message):
    label_store.read_label_set(directory)
  assert _digests(directory) == before


def test_disk_full_while_writing_a_label_shard(tmp_path, monkeypatch):
  directory = str(tmp_path / "labels")
  label_store.write_shard(directory, 0, [_record(0), _record(1)])
  before = _digests(directory)

  class HalfWritten:
    """A file whose write stops half way with ENOSPC."""

    def __init__(self, path, *args, **kwargs):
      # pylint: disable-next=consider-using-with
      self._f = open(path, *args, **kwargs)
      self.name = path

    def write(self, text):
      self._f.write(text[:len(text) // 2])
      self._f.flush()
      raise _disk_full(self.name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self._f.close()

  monkeypatch.setattr(label_store, "open", HalfWritten, raising=False)
  shard_1 = label_store.shard_path(directory, 1)
  with pytest.raises(OSError, match=rf"disk full while writing "
                                    rf"{re.escape(shard_1)}; the shards "
                                    "already written are intact"):
    label_store.write_shard(directory, 1, [_record(2), _record(3)])
  monkeypatch.undo()
  assert _digests(directory) == before  # No partial or temporary file.
  assert label_store.complete_shards(directory) == [0]
  assert [r["index"] for r in label_store.read_shard(
      label_store.shard_path(directory, 0))] == [0, 1]


# ------------------------------------- checks made before the first stage --


@pytest.mark.parametrize("stages,overrides,message", [
    # The label set the run makes holds labels.num_problems (8) problems.
    ("sft,labels,prm", {"prm.label_problems": 9},
     r"config\.prm\.label_problems=9: the label set holds only 8 problems "
     r"\(config\.labels\.num_problems\)"),
    # A prm stage with no label set to train on.
    ("sft,prm", {},
     r"config\.stages: the prm stage needs a complete label set: "
     r".*labels: not a complete label set"),
    ("sft,rl", {"rl.method": "pav", "rl.advantage_estimator": "drgrpo"},
     r"config\.rl\.method='pav' with prm_source='model' needs a trained "
     r"verifier"),
    ("sft,sft_continue", {},
     r"config\.sft\.continue_seconds must be > 0"),
])
def test_bad_values_fail_before_any_stage_runs(tmp_path, stages, overrides,
                                               message):
  workdir = tmp_path / "run"
  config = _config(**overrides)
  config.stages = stages
  with pytest.raises(config_lib.ConfigError, match=message):
    pipeline.run(config, str(workdir))
  assert not workdir.exists()  # Not even config.json: no stage ran.


def test_a_reused_label_set_too_small_fails_before_any_stage(tmp_path):
  labels = tmp_path / "labels_run"
  _label_set(str(labels / "labels"), num_shards=2, per_shard=4,
             manifest_samples_per_problem=2)  # 8 solutions: 4 problems.
  config = _config(**{"labels.init_from": str(labels),
                      "prm.label_problems": 5})
  config.stages = "sft,prm"
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.prm\.label_problems=5: the label set "
                           r"holds only 4 problems \(.*labels_run/labels/"
                           r"manifest\.json\)"):
    pipeline.run(config, str(tmp_path / "run"))
  config.prm.label_problems = 4
  config.prm.batch_size = 3
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.prm\.batch_size=3 must be a multiple of "
                           r"the label set's 2 solutions per problem"):
    prm_stages.check_config(config, str(tmp_path / "run"))
  config.prm.batch_size = 4
  prm_stages.check_config(config, str(tmp_path / "run"))  # Fits.
  assert not (tmp_path / "run").exists()
