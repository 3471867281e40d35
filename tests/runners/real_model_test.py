"""The real-model path: a HF Qwen2 checkpoint + tokenizer.json + GSM8K JSONL.

No hub is reachable, so the test makes a tiny random Qwen2 checkpoint with
`save_hf`, a word-level `tokenizer.json` with the `tokenizers` library, and a
few GSM8K-format lines, then runs `configs/qwen_gsm8k.py:smoke` end to end.
"""

import json
import os

import jax
import pytest
from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers
from tokenizers import trainers

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.runners import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

_LINES = [
    {"question": f"Tom has {a} apples and buys {b} more. How many now?",
     "answer": f"He has {a} + {b} = {a + b} apples.\n\n#### {a + b}"}
    for a, b in [(2, 3), (4, 1), (5, 5), (7, 2), (1, 1), (3, 6), (8, 1),
                 (2, 2), (6, 3), (9, 0)]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("real")
  train, evalf = root / "train.jsonl", root / "test.jsonl"
  train.write_text("\n".join(json.dumps(l) for l in _LINES[:8]) + "\n")
  evalf.write_text("\n".join(json.dumps(l) for l in _LINES[8:]) + "\n")
  tokenizer = Tokenizer(tok_models.WordLevel(unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.WordLevelTrainer(
      special_tokens=["<|endoftext|>", "<unk>", "<|im_start|>",
                      "<|im_end|>"])
  corpus = [l["question"] + l["answer"] for l in _LINES] + [
      "0123456789 +-=#\n\\boxed{} Please reason step by step, and put your "
      "final answer within system user assistant"]
  tokenizer.train_from_iterator(corpus, trainer)
  checkpoint = root / "checkpoint"
  checkpoint.mkdir()
  tokenizer.save(str(checkpoint / "tokenizer.json"))
  vocab = tokenizer.get_vocab_size()
  model_config = models.preset("test", vocab)
  params = models.init_params(model_config, jax.random.key(0))
  models.save_hf(str(checkpoint), model_config, params)
  return {"checkpoint": str(checkpoint), "train": str(train),
          "eval": str(evalf)}


def _config(files):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = files["checkpoint"]
  config.task.train_path = files["train"]
  config.task.eval_path = files["eval"]
  config.model.dtype = "float32"
  config.stages = "sft,rl"
  return config


def test_qwen_gsm8k_smoke_runs_end_to_end(files, tmp_path):
  summary = pipeline.run(_config(files), str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  assert 0.0 <= summary["stages"]["rl"]["eval/accuracy"] <= 1.0
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert len(records) == 2


def test_missing_data_file_is_a_clear_error(files, tmp_path):
  config = _config(files)
  config.task.train_path = str(tmp_path / "missing.jsonl")
  with pytest.raises((ValueError, FileNotFoundError), match="missing.jsonl"):
    pipeline.run(config, str(tmp_path / "w"))


def test_malformed_jsonl_names_file_and_line(files, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(_LINES[0]) + "\n{not json\n")
  config = _config(files)
  config.task.train_path = str(bad)
  with pytest.raises(ValueError, match="bad.jsonl:2"):
    pipeline.run(config, str(tmp_path / "w"))


def test_oracle_prm_needs_step_labels(files, tmp_path):
  config = _config(files)
  config.rl.method = "pav"
  config.rl.prm_source = "oracle"
  with pytest.raises(config_lib.ConfigError, match="ground-truth step labels"):
    pipeline.run(config, str(tmp_path / "w"))
