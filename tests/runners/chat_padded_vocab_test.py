"""A checkpoint with a chat template, several EOS ids and a padded vocabulary.

Released checkpoints (Qwen2.5: 151665 tokens, 151936 embedding rows) pad the
embedding past the tokenizer's vocabulary, stop on every id of
generation_config.json's `eos_token_id`, and expect prompts rendered with
their chat template. The test makes such a tiny random Qwen2 (6 padding
rows) and runs `configs/qwen_gsm8k.py:smoke` with `task.prompt_template=chat`.
"""

import json
import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards import models
from rl_rewards.models import tiny_hub
from rl_rewards.runners import evaluation
from rl_rewards.runners import pipeline
from tests.runners import gsm8k_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
PADDING_ROWS = 6
CHATML = (
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat")
  train, evalf = root / "train.jsonl", root / "test.jsonl"
  train.write_text("".join(json.dumps(l) + "\n" for l in gsm8k_files.ROWS[:8]))
  evalf.write_text("".join(json.dumps(l) + "\n" for l in gsm8k_files.ROWS[8:]))
  tokenizer = gsm8k_files.word_level_tokenizer(
      ["<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"],
      "0123456789 +-=#\n system user assistant Be brief .")
  checkpoint = root / "checkpoint"
  checkpoint.mkdir()
  tokenizer.save(str(checkpoint / "tokenizer.json"))
  tiny_hub.write_tokenizer_config(
      str(checkpoint), chat_template=CHATML, eos_token="<|endoftext|>",
      pad_token="<|endoftext|>")
  tiny_hub.write_generation_config(str(checkpoint), [3, 0])
  vocab = tokenizer.get_vocab_size()
  tiny_hub.write_weights(str(checkpoint),
                         models.preset("test", vocab + PADDING_ROWS))
  return {"checkpoint": str(checkpoint), "train": str(train),
          "eval": str(evalf), "vocab": vocab}


def _config(files):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = files["checkpoint"]
  config.task.train_path = files["train"]
  config.task.eval_path = files["eval"]
  config.task.prompt_template = "chat"
  config.task.system_prompt = "Be brief."
  config.model.dtype = "float32"
  return config


def test_masks_and_samples_cover_the_padded_vocabulary(files, tmp_path,
                                                       monkeypatch):
  ctx = pipeline.build_context(_config(files), str(tmp_path))
  vocab = files["vocab"]
  tokenizer = ctx.task.tokenizer
  assert ctx.model_config.vocab_size == vocab + PADDING_ROWS
  assert ctx.task.delimiter_mask().shape == (vocab + PADDING_ROWS,)
  assert not ctx.task.delimiter_mask()[vocab:].any()
  # <|endoftext|> (EOS), then generation_config's <|im_end|>.
  assert tokenizer.stop_ids == (0, 3) and tokenizer.end_of_turn_id == 3
  assert tokenizer.format_prompt("Hi") == (
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
      "<|im_end|>\n<|im_start|>assistant\n")
  sft = ctx.task.encode_sft(ctx.task.problems("train", 0, 2))
  ends = [row[mask == 1][-1] for row, mask in zip(sft["tokens"],
                                                  sft["loss_mask"])]
  assert ends == [3, 3]
  params = pipeline.initial_params(ctx)
  sampled = []
  sample = evaluation.sampler.sample
  def recording_sample(*args, **kwargs):
    out = sample(*args, **kwargs)
    sampled.append(np.asarray(out.tokens))
    return out
  monkeypatch.setattr(evaluation.sampler, "sample", recording_sample)
  out = evaluation.generate(ctx, params, ctx.task.problems("eval", 0, 2),
                            batch_size=8, rng=jax.random.key(0),
                            temperature=2.0, num_samples=2)
  assert len(out["texts"]) == 4
  # 16 rows of 24 tokens at temperature 2: the 6 padding rows would be
  # drawn many times were they not masked.
  assert sampled and all((t < vocab).all() for t in sampled)
  ctx.writer.close()


def test_bad_chat_settings_are_input_errors(files, tmp_path):
  config = _config(files)
  config.task.chat_template_kwargs = "[1]"
  with pytest.raises(config_lib.ConfigError,
                     match="task.chat_template_kwargs"):
    pipeline.run(config, str(tmp_path / "a"))
  config = _config(files)
  os.rename(os.path.join(files["checkpoint"], "tokenizer_config.json"),
            os.path.join(files["checkpoint"], "moved.json"))
  try:
    with pytest.raises(errors.InputError,
                       match="tokenizer_config.json: no chat_template"):
      pipeline.run(config, str(tmp_path / "b"))
  finally:
    os.rename(os.path.join(files["checkpoint"], "moved.json"),
              os.path.join(files["checkpoint"], "tokenizer_config.json"))


@pytest.mark.slow
def test_smoke_runs_end_to_end(files, tmp_path):
  config = _config(files)
  config.stages = "sft,rl"
  summary = pipeline.run(config, str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  assert 0.0 <= summary["stages"]["rl"]["eval/accuracy"] <= 1.0


@pytest.mark.parametrize("changes,match", [
    ({"system_prompt": "x"}, "task.system_prompt: needs prompt_template"),
    ({"chat_template_kwargs": "{}"}, "task.chat_template_kwargs: needs"),
    ({"prompt_template": "chat", "chat_template_kwargs": "{x"},
     "task.chat_template_kwargs: invalid JSON"),
    ({"prompt_template": "chat", "chat_template_kwargs": '{"messages": 1}'},
     "set by the prompt renderer"),
    ({"prompt_template": "no slot"}, "task.prompt_template: must contain"),
    ({"prompt_template": "chat", "name": "arith"}, "not the arith task"),
])
def test_chat_keys_are_validated(changes, match):
  config = config_lib.base_config()
  config.task.name = "gsm8k"
  config.task.train_path = config.task.eval_path = "x.jsonl"
  for key, value in changes.items():
    config.task[key] = value
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(config)
  config.task.update({"prompt_template": "chat", "name": "gsm8k",
                      "system_prompt": "x",
                      "chat_template_kwargs": '{"enable_thinking": false}'})
  config_lib.validate(config)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["head", "generative", "implicit"])
def test_labels_and_verifiers_on_the_padded_vocabulary(files, tmp_path,
                                                       model):
  # Monte-Carlo labels (the PolicySampler with its stop ids and padding
  # mask), then each verifier kind trained on them.
  config = _config(files)
  config.stages = "labels,prm"
  config.labels.num_problems = 8
  config.labels.samples_per_problem = 2
  config.labels.num_rollouts = 2
  config.labels.problems_per_shard = 8
  config.labels.prefix_batch_size = 8
  config.prm.model = model
  config.prm.steps = 2
  config.prm.batch_size = 8
  config.prm.warmup_steps = 0
  config.prm.valid_fraction = 0.25
  summary = pipeline.run(config, str(tmp_path))
  assert summary["stages"]["labels"]["labels/solutions"] == 16
  assert summary["stages"]["prm"]["prm/steps"] == 2
