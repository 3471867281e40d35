"""Tiny random checkpoints in the Hugging Face hub's layout, and GSM8K rows.

What a user downloads from the hub, shrunk to about 20,000 parameters, to
try the real-model path (`configs/qwen_gsm8k.py`) without a download, and
what the tests that run that path build:

    info = tiny_hub.write_checkpoint("/tmp/tiny/checkpoint", "llama")
    tiny_hub.write_gsm8k("/tmp/tiny/gsm8k")

A checkpoint directory holds `config.json` in the hub's form for its family
(padded vocabulary, the family's RoPE and attention settings), random
weights as `model.safetensors` (`models.save_hf`), a word-level
`tokenizer.json` (the `tokenizers` library) that covers the GSM8K rows
here, `tokenizer_config.json` with the family's special tokens and a chat
template in its format, and `generation_config.json` with the family's stop
ids. The parts (`word_level_tokenizer`, `write_tokenizer_config`,
`write_generation_config`, `write_weights`) can be used alone.

The chat templates are short ones of our own that lay out a system + user
conversation in each family's format; the released checkpoints' own
templates are longer (tools, dates, reasoning switches).
"""

import dataclasses
import json
import os

import jax
from tokenizers import Regex
from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers
from tokenizers import trainers

from rl_rewards.models import config as model_config_lib
from rl_rewards.models import hf as hf_lib
from rl_rewards.models import model as model_lib

# Ten GSM8K-layout rows: `question`, and an `answer` whose last line is
# "#### x" (steps separated by blank lines).
GSM8K_ROWS = [
    {"question": f"Tom has {a} apples and buys {b} more. How many now?",
     "answer": f"He has {a} + {b} = {a + b} apples.\n\n#### {a + b}"}
    for a, b in [(2, 3), (4, 1), (5, 5), (7, 2), (1, 1), (3, 6), (8, 1),
                 (2, 2), (6, 3), (9, 0)]]

# Words the tokenizer knows besides the rows': digits and signs, the chat
# templates' roles, and the default prompt of `configs/qwen_gsm8k.py`.
DEFAULT_EXTRA_TEXT = (
    "0123456789 +-=#\n system user assistant model Be brief . Please reason "
    "step by step, and put your final answer within \\boxed{}")

_SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=48, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-6)

_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}")
_QWEN3 = _CHATML.replace(
    "{{- '<|im_start|>assistant\\n' }}",
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
_LLAMA = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
_MISTRAL = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}")
_GEMMA3 = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}"
    "{%- endif -%}")


@dataclasses.dataclass(frozen=True)
class Family:
  """What a tiny checkpoint of one architecture family holds.

  Attributes:
    hf_config: config.json without `vocab_size` (set from the tokenizer).
    special_tokens: the special tokens, ids 0, 1, ... in this order.
    chat_template: the template in tokenizer_config.json.
    bos_token, eos_token: tokenizer_config.json's (None: no BOS).
    end_of_turn: the token that ends an assistant turn.
    stop_tokens: generation_config.json's `eos_token_id`, as tokens.
    system_prompt: whether the template renders a system message.
  """
  hf_config: dict
  special_tokens: tuple
  chat_template: str
  bos_token: str | None
  eos_token: str
  end_of_turn: str
  stop_tokens: tuple
  system_prompt: bool = True


FAMILIES = {
    "qwen2": Family(
        dict(_SMALL, model_type="qwen2", rope_theta=1e6,
             tie_word_embeddings=True),
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), _CHATML,
        None, "<|im_end|>", "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "qwen3": Family(
        dict(_SMALL, model_type="qwen3", head_dim=16, attention_bias=False,
             rope_theta=1e6, tie_word_embeddings=True),
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
         "</think>"), _QWEN3,
        None, "<|im_end|>", "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "llama": Family(
        dict(_SMALL, model_type="llama", head_dim=8, rope_theta=5e5,
             tie_word_embeddings=False,
             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 32}),
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
         "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"), _LLAMA,
        "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
        ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")),
    "mistral": Family(
        dict(_SMALL, model_type="mistral", head_dim=8, rope_theta=1e6,
             sliding_window=6, tie_word_embeddings=False),
        ("<s>", "</s>", "[INST]", "[/INST]"), _MISTRAL,
        "<s>", "</s>", "</s>", ("</s>",), system_prompt=False),
    "gemma3_text": Family(
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
        ("<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"),
        _GEMMA3, "<bos>", "<eos>", "<end_of_turn>",
        ("<eos>", "<end_of_turn>")),
}


@dataclasses.dataclass(frozen=True)
class TinyCheckpoint:
  """A written checkpoint: its directory, the tokenizer's vocabulary size
  (the model's is larger by the padding rows), the end-of-turn id and the
  model config."""
  path: str
  tokenizer_vocab_size: int
  end_of_turn_id: int
  model_config: model_config_lib.ModelConfig


def word_level_tokenizer(special_tokens, extra_text: str = DEFAULT_EXTRA_TEXT,
                         rows=GSM8K_ROWS, newline_tokens: bool = False
                         ) -> Tokenizer:
  """A whitespace word-level tokenizer over `rows` and `extra_text`.

  Args:
    special_tokens: the special tokens, ids 0, 1, ... in this order; "<unk>"
      is added after them when missing.
    extra_text: more words (and characters) the vocabulary must hold.
    rows: GSM8K-layout rows whose questions and answers it must cover.
    newline_tokens: keep runs of newlines as tokens of their own ("\n",
      "\n\n") and split words at spaces only, so that K steps joined by a
      newline delimiter are K steps by the token rule, as with released
      byte-level vocabularies (what PRMs on step-labelled files need).
      Otherwise every kind of whitespace separates words and vanishes.
  """
  special_tokens = list(special_tokens)
  if "<unk>" not in special_tokens:
    special_tokens.append("<unk>")
  tokenizer = Tokenizer(tok_models.WordLevel(unk_token="<unk>"))
  if newline_tokens:
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), "isolated"),
        pre_tokenizers.Split(Regex(" +"), "removed")])
    extra_text += " \n x \n\n x \n\n\n"
  else:
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.WordLevelTrainer(special_tokens=special_tokens)
  corpus = [r["question"] + r["answer"] for r in rows] + [extra_text]
  tokenizer.train_from_iterator(corpus, trainer)
  return tokenizer


def write_tokenizer_config(path: str, *, chat_template: str,
                           eos_token: str, pad_token: str,
                           bos_token: str | None = None):
  """Writes `<path>/tokenizer_config.json` with its special tokens and chat
  template."""
  _write_json(os.path.join(path, "tokenizer_config.json"), {
      "bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token,
      "chat_template": chat_template})


def write_generation_config(path: str, eos_token_ids):
  """Writes `<path>/generation_config.json`: every id that ends a row."""
  _write_json(os.path.join(path, "generation_config.json"),
              {"eos_token_id": [int(i) for i in eos_token_ids]})


def write_weights(path: str, model_config: model_config_lib.ModelConfig,
                  seed: int = 0):
  """Writes random weights and config.json (`models.save_hf`)."""
  params = model_lib.init_params(model_config, jax.random.key(seed))
  hf_lib.save_hf(path, model_config, params)


def write_checkpoint(path: str, family: str = "qwen2", *,
                     padding_rows: int = 5, seed: int = 0,
                     chat_template: str | None = None,
                     extra_text: str = DEFAULT_EXTRA_TEXT,
                     newline_tokens: bool = False) -> TinyCheckpoint:
  """Writes a tiny random checkpoint of `family` into directory `path`.

  Args:
    path: the checkpoint directory (created; existing files are replaced).
    family: a key of `FAMILIES`.
    padding_rows: embedding rows past the tokenizer's vocabulary, as
      released checkpoints have (Qwen2.5: 151936 rows, 151665 tokens).
    seed: of the random weights.
    chat_template: instead of the family's own (e.g. a released
      checkpoint's).
    extra_text: words the tokenizer must know besides `GSM8K_ROWS`'.
    newline_tokens: newline runs as tokens (`word_level_tokenizer`).

  Returns:
    What was written (`TinyCheckpoint`).
  """
  if family not in FAMILIES:
    raise ValueError(f"family {family!r}: one of {sorted(FAMILIES)}.")
  spec = FAMILIES[family]
  os.makedirs(path, exist_ok=True)
  tokenizer = word_level_tokenizer(spec.special_tokens, extra_text,
                                   newline_tokens=newline_tokens)
  tokenizer.save(os.path.join(path, "tokenizer.json"))
  write_tokenizer_config(
      path, chat_template=chat_template or spec.chat_template,
      bos_token=spec.bos_token, eos_token=spec.eos_token,
      pad_token=spec.special_tokens[0])
  write_generation_config(
      path, [tokenizer.token_to_id(t) for t in spec.stop_tokens])
  vocab = tokenizer.get_vocab_size()
  model_config = hf_lib.config_from_hf(
      dict(spec.hf_config, vocab_size=vocab + padding_rows))
  write_weights(path, model_config, seed)
  return TinyCheckpoint(path, vocab, tokenizer.token_to_id(spec.end_of_turn),
                        model_config)


def write_gsm8k(path: str, rows=GSM8K_ROWS, test_rows: int = 2) -> dict:
  """Writes GSM8K-format `train.jsonl` and `test.jsonl` (the last
  `test_rows` rows) into directory `path`; returns {split: file}."""
  os.makedirs(path, exist_ok=True)
  files = {"train": os.path.join(path, "train.jsonl"),
           "test": os.path.join(path, "test.jsonl")}
  for split, part in (("train", rows[:-test_rows]),
                      ("test", rows[-test_rows:])):
    with open(files[split], "w", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\n" for row in part)
  return files


def stepwise_rows(count: int = 8) -> list[dict]:
  """Step-labelled solutions in TRL's stepwise layout (`prompt`,
  `completions`, `labels`): two right steps, and in odd rows a wrong third
  one."""
  rows = []
  for i in range(count):
    a, b = i + 1, i + 2
    steps = [f"{a} + {b} = {a + b}", f"{a + b} + 1 = {a + b + 1}"]
    labels = [True, True]
    if i % 2:
      steps.append(f"so {a + b + 3}")
      labels.append(False)
    rows.append({"prompt": f"Tom has {a} apples and buys {b} more. "
                           "How many now?",
                 "completions": steps, "labels": labels})
  return rows


def processbench_rows(rows) -> list[dict]:
  """Stepwise rows in ProcessBench's layout: `label` is the index of the
  first wrong step, -1 when every step is right."""
  return [{"id": f"tiny-{i}", "generator": "tiny", "problem": r["prompt"],
           "steps": r["completions"],
           "label": next((k for k, y in enumerate(r["labels"]) if not y), -1),
           "final_answer_correct": all(r["labels"])}
          for i, r in enumerate(rows)]


STEPWISE_TEXT = " ".join(
    " ".join([r["prompt"], *r["completions"]]) for r in stepwise_rows(16))


def write_prm_data(path: str, count: int = 8) -> dict:
  """Writes `train.jsonl` (stepwise) and `processbench.jsonl` (the same
  solutions in ProcessBench's layout) into `path`; returns {"prm_train":
  file, "processbench": file}."""
  os.makedirs(path, exist_ok=True)
  rows = stepwise_rows(count)
  files = {"prm_train": os.path.join(path, "train.jsonl"),
           "processbench": os.path.join(path, "processbench.jsonl")}
  for name, part in (("prm_train", rows), ("processbench",
                                           processbench_rows(rows))):
    with open(files[name], "w", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\n" for row in part)
  return files


def _write_json(path, value):
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
    f.write("\n")
