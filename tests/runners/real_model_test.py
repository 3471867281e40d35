"""The real-model path: a HF Qwen2 checkpoint + tokenizer.json + GSM8K data.

No hub is reachable, so the test makes a tiny random Qwen2 checkpoint
(`rl_rewards.models.tiny_hub`: random weights through `save_hf`, a
word-level `tokenizer.json` with the `tokenizers` library), and a
few GSM8K-format rows (train: two Parquet shards; eval: JSONL) plus two
held-out sets (MATH-500 JSONL, AIME Parquet), then runs
`configs/qwen_gsm8k.py:smoke` end to end.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.models import tiny_hub
from rl_rewards.runners import pipeline
from tests.runners import gsm8k_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))



@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("real")
  train, evalf = root / "train", root / "test.jsonl"
  train.mkdir()
  for shard, lines in enumerate((gsm8k_files.ROWS[:5], gsm8k_files.ROWS[5:8])):
    pq.write_table(pa.Table.from_pylist(lines),
                   str(train / f"train-{shard:05d}-of-00002.parquet"))
  evalf.write_text("\n".join(json.dumps(l) for l in gsm8k_files.ROWS[8:]) + "\n")
  math500 = root / "math500.jsonl"
  math500.write_text("".join(json.dumps(
      {"problem": f"What is {a} + {b}?", "solution": f"\\boxed{{{a + b}}}",
       "answer": str(a + b)}) + "\n" for a, b in [(1, 2), (3, 4), (5, 1)]))
  aime = root / "aime_2024.parquet"
  pq.write_table(pa.Table.from_pylist([
      {"ID": f"2024-I-{i}", "Problem": f"Tom has {i} apples. How many now?",
       "Solution": "", "Answer": i} for i in (3, 7)]), str(aime))
  tokenizer = gsm8k_files.word_level_tokenizer(
      ["<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"],
      "0123456789 +-=#\n\\boxed{} Please reason step by step, and put your "
      "final answer within system user assistant")
  checkpoint = root / "checkpoint"
  checkpoint.mkdir()
  tokenizer.save(str(checkpoint / "tokenizer.json"))
  tiny_hub.write_weights(str(checkpoint),
                         models.preset("test", tokenizer.get_vocab_size()))
  return {"checkpoint": str(checkpoint), "train": str(train),
          "eval": str(evalf), "math500": str(math500), "aime": str(aime)}


def _config(files):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = files["checkpoint"]
  config.task.train_path = files["train"]
  config.task.eval_path = files["eval"]
  config.eval.sets = f"math500:{files['math500']},aime24:{files['aime']}"
  config.model.dtype = "float32"
  config.stages = "sft,rl"
  return config


def test_qwen_gsm8k_smoke_runs_end_to_end(files, tmp_path):
  summary = pipeline.run(_config(files), str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  # The summary holds the final step's held-out numbers as logged: ratios of
  # counts over the 2 held-out rows, mean@2 <= pass@2 <= 2 * mean@2.
  final = summary["stages"]["rl"]
  logged = [r for r in metrics_lib.read_metrics(str(tmp_path))
            if r["stage"] == "rl" and "eval/pass@2" in r]
  assert [r["step"] for r in logged] == [2]
  for key in ("eval/accuracy", "eval/pass@2", "eval/mean@2"):
    assert logged[-1][key] == final[key], key
  for key, count in (("eval/accuracy", 2), ("eval/pass@2", 2),
                     ("eval/mean@2", 4)):
    assert final[key] * count == round(final[key] * count), key
  assert final["eval/mean@2"] <= final["eval/pass@2"] <= 2 * final[
      "eval/mean@2"]
  for stage in ("sft", "rl"):
    for name in ("math500", "aime24"):
      for metric in ("pass@1", "pass@2"):
        assert 0.0 <= summary["stages"][stage][f"eval/{name}/{metric}"] <= 1.0
  final = [r for r in metrics_lib.read_metrics(str(tmp_path))
           if "eval/aime24/pass@2" in r]
  assert [r["stage"] for r in final] == ["sft", "rl"]
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
  bad.write_text(json.dumps(gsm8k_files.ROWS[0]) + "\n{not json\n")
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
