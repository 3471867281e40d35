"""`configs/qwen_gsm8k.py:smoke` on every supported architecture.

For each family the test writes what a user downloads from the hub, shrunk:
a config.json in the hub's layout (padded vocabulary, the family's RoPE and
attention settings), random weights through `save_hf`, a tokenizer.json
with the family's special tokens, a tokenizer_config.json holding the
family's real chat template, a generation_config.json with several stop ids,
and a GSM8K-layout training set as Parquet shards. The SFT batches end on
the template's end-of-turn token, and an RL step with held-out evaluation
runs end to end with `task.prompt_template="chat"`.
"""

import json
import os

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.models import hf as hf_lib
from rl_rewards.runners import pipeline
from tests.runners import gsm8k_files
from tests.tasks import chat_templates

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
PADDING_ROWS = 5

_MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}")

_SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=48, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-6)

# family -> (config.json without vocab_size, special tokens, chat template,
#            end-of-turn token, generation_config eos tokens)
FAMILIES = {
    "qwen2": (
        dict(_SMALL, model_type="qwen2", rope_theta=1e6,
             tie_word_embeddings=True),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        chat_templates.QWEN25, "<|im_end|>",
        ["<|im_end|>", "<|endoftext|>"]),
    "qwen3": (
        dict(_SMALL, model_type="qwen3", head_dim=16, attention_bias=False,
             rope_theta=1e6, tie_word_embeddings=True),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
         "</think>"],
        chat_templates.QWEN3, "<|im_end|>",
        ["<|im_end|>", "<|endoftext|>"]),
    "llama3": (
        dict(_SMALL, model_type="llama", head_dim=8,
             rope_theta=5e5, tie_word_embeddings=False,
             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 32}),
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
         "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"],
        chat_templates.LLAMA31, "<|eot_id|>",
        ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
    "mistral": (
        dict(_SMALL, model_type="mistral", head_dim=8, rope_theta=1e6,
             sliding_window=6, tie_word_embeddings=False),
        ["<s>", "</s>", "[INST]", "[/INST]"],
        _MISTRAL_TEMPLATE, "</s>", ["</s>"]),
    "gemma3_text": (
        dict(_SMALL, model_type="gemma3_text", num_hidden_layers=3,
             head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
             layer_types=["sliding_attention", "full_attention",
                          "sliding_attention"],
             hidden_activation="gelu_pytorch_tanh",
             tie_word_embeddings=True,
             rope_parameters={
                 "full_attention": {"rope_type": "default",
                                    "rope_theta": 1e6},
                 "sliding_attention": {"rope_type": "default",
                                       "rope_theta": 1e4}}),
        ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        chat_templates.GEMMA3, "<end_of_turn>",
        ["<eos>", "<end_of_turn>"]),
}



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
  hf_config, specials, template, end_of_turn, stops = FAMILIES[family]
  tokenizer = gsm8k_files.word_level_tokenizer(
      specials + ["<unk>"],
      "0123456789 +-=#\n system user assistant model Be brief .")
  checkpoint = root / family
  checkpoint.mkdir()
  tokenizer.save(str(checkpoint / "tokenizer.json"))
  bos = {"qwen2": None, "qwen3": None, "llama3": "<|begin_of_text|>",
         "mistral": "<s>", "gemma3_text": "<bos>"}[family]
  eos = {"qwen2": "<|im_end|>", "qwen3": "<|im_end|>",
         "llama3": "<|eot_id|>", "mistral": "</s>",
         "gemma3_text": "<eos>"}[family]
  (checkpoint / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": bos, "eos_token": eos, "pad_token": specials[0],
      "chat_template": template}))
  (checkpoint / "generation_config.json").write_text(json.dumps({
      "eos_token_id": [tokenizer.token_to_id(t) for t in stops]}))
  vocab = tokenizer.get_vocab_size()
  model_config = hf_lib.config_from_hf(
      dict(hf_config, vocab_size=vocab + PADDING_ROWS))
  params = models.init_params(model_config, jax.random.key(0))
  models.save_hf(str(checkpoint), model_config, params)
  return str(checkpoint), vocab, tokenizer.token_to_id(end_of_turn)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_smoke_pipeline_runs_on_every_architecture(family, data, tmp_path):
  checkpoint, vocab, end_of_turn = _checkpoint(tmp_path, family)
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = checkpoint
  config.model.dtype = "float32"
  config.task.train_path = data["train"]
  config.task.eval_path = data["eval"]
  config.task.prompt_template = "chat"
  config.task.system_prompt = "Be brief." if family != "mistral" else ""
  if family == "qwen3":
    config.task.chat_template_kwargs = '{"enable_thinking": false}'
  config.task.max_prompt_len = 96   # Llama 3's template adds a date header.
  config.stages = "rl"   # SFT steps of each family: tests/models.
  config.rl.steps = 1
  workdir = str(tmp_path / "run")
  ctx = pipeline.build_context(config, workdir)
  # The architecture, the padded vocabulary and the template's stop token
  # are what the run uses.
  assert ctx.model_config.architecture == (
      "llama" if family == "llama3" else family)
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
