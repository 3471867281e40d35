"""`configs/qwen_gsm8k.py:smoke` on every supported architecture.

For each family the test writes what a user downloads from the hub, shrunk
(`rl_rewards.models.tiny_hub`): a config.json in the hub's layout (padded
vocabulary, the family's RoPE and attention settings), random weights
through `save_hf`, a tokenizer.json with the family's special tokens, a
tokenizer_config.json holding the family's real chat template, a
generation_config.json with several stop ids, and a GSM8K-layout training
set as Parquet shards. The SFT batches end on the template's end-of-turn
token, and an RL step with held-out evaluation runs end to end with
`task.prompt_template="chat"`.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib
from rl_rewards.models import tiny_hub
from rl_rewards.runners import pipeline
from tests.runners import gsm8k_files
from tests.tasks import chat_templates

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
PADDING_ROWS = 5

# The released checkpoints' own chat templates, in place of the short ones
# of `tiny_hub` (Mistral's is short already).
REAL_TEMPLATES = {"qwen2": chat_templates.QWEN25,
                  "qwen3": chat_templates.QWEN3,
                  "llama": chat_templates.LLAMA31,
                  "mistral": None,
                  "gemma3_text": chat_templates.GEMMA3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("parquet")
  train = root / "train"
  train.mkdir()
  for shard, rows in enumerate((gsm8k_files.ROWS[:4], gsm8k_files.ROWS[4:8])):
    pq.write_table(pa.Table.from_pylist(rows),
                   str(train / f"train-{shard:05d}-of-00002.parquet"))
  evalf = root / "test.parquet"
  pq.write_table(pa.Table.from_pylist(gsm8k_files.ROWS[8:]), str(evalf))
  return {"train": str(train), "eval": str(evalf)}


def _checkpoint(root, family):
  info = tiny_hub.write_checkpoint(
      str(root / family), family, padding_rows=PADDING_ROWS,
      chat_template=REAL_TEMPLATES[family])
  return info.path, info.tokenizer_vocab_size, info.end_of_turn_id


@pytest.mark.parametrize("family", sorted(tiny_hub.FAMILIES))
def test_smoke_pipeline_runs_on_every_architecture(family, data, tmp_path):
  checkpoint, vocab, end_of_turn = _checkpoint(tmp_path, family)
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = checkpoint
  config.model.dtype = "float32"
  config.task.train_path = data["train"]
  config.task.eval_path = data["eval"]
  config.task.prompt_template = "chat"
  config.task.system_prompt = (
      "Be brief." if tiny_hub.FAMILIES[family].system_prompt else "")
  if family == "qwen3":
    config.task.chat_template_kwargs = '{"enable_thinking": false}'
  config.task.max_prompt_len = 96   # Llama 3's template adds a date header.
  config.stages = "rl"   # SFT steps of each family: tests/models.
  config.rl.steps = 1
  workdir = str(tmp_path / "run")
  ctx = pipeline.build_context(config, workdir)
  # The architecture, the padded vocabulary and the template's stop token
  # are what the run uses.
  assert ctx.model_config.architecture == family
  assert ctx.model_config.vocab_size == vocab + PADDING_ROWS
  assert ctx.task.delimiter_mask().shape == (vocab + PADDING_ROWS,)
  assert end_of_turn in ctx.task.tokenizer.stop_ids
  sft = ctx.task.encode_sft(ctx.task.problems("train", 0, 2))
  ends = [row[mask == 1][-1] for row, mask in zip(sft["tokens"],
                                                  sft["loss_mask"])]
  assert ends == [end_of_turn, end_of_turn]
  ctx.writer.close()
  summary = pipeline.run(config, workdir)
  assert summary["stages"]["rl"]["rl/steps"] == 1
  losses = [r["train/loss"] for r in metrics_lib.read_metrics(workdir)
            if r["stage"] == "rl" and "train/loss" in r]
  assert len(losses) == 1 and np.isfinite(losses[0])
