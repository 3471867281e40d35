"""Chat-template prompts of HFTokenizer against transformers' renderer.

Each case writes a tiny checkpoint directory (a byte-level BPE tokenizer.json
with the family's special tokens, tokenizer_config.json and optionally
chat_template.jinja / generation_config.json), then compares
`HFTokenizer.format_prompt` character for character with transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
on a tokenizer loaded from the same directory.
"""

import json
import os

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers

import chat_templates
from rl_rewards import errors
from rl_rewards.tasks import tokenizer as tokenizer_lib

QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>")
GEMMA_SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                 "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                 "<image_soft_token>")
QUESTION = "  What is 12 + 7? Answer with <b>a number</b> & café.\n"
SYSTEM = "You are a careful solver.\nThink step by step. "


def _added(content):
  """tokenizer_config.json's AddedToken form of a special token."""
  return {"content": content, "lstrip": False, "normalized": False,
          "rstrip": False, "single_word": False, "special": True,
          "__type": "AddedToken"}


def write_checkpoint(directory, special, config, *, template=None,
                     jinja=None, generation_config=None):
  """Writes tokenizer.json (+ configs) into `directory`; returns its path."""
  os.makedirs(directory, exist_ok=True)
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                               use_regex=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300, special_tokens=list(special),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False)
  tok.train_from_iterator(["user\nWhat is 12 + 7?\nassistant\n19\n"] * 10,
                          trainer)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  config = dict(config, tokenizer_class="PreTrainedTokenizerFast")
  if template is not None:
    config["chat_template"] = template
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  if jinja is not None:
    with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
      f.write(jinja)
  if generation_config is not None:
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
      json.dump(generation_config, f)
  return path


QWEN_CONFIG = {"bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>"}
LLAMA_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
GEMMA_CONFIG = {"bos_token": _added("<bos>"), "eos_token": _added("<eos>"),
                "pad_token": _added("<pad>"), "unk_token": _added("<unk>"),
                "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>"}

# name: (special tokens, tokenizer_config.json, template, template kwargs,
#        generation_config.json, expected end-of-turn token).
CASES = {
    "qwen2.5": (QWEN_SPECIAL, QWEN_CONFIG, chat_templates.QWEN25, None,
                {"eos_token_id": [2, 0]}, "<|im_end|>"),
    "qwen3": (QWEN_SPECIAL, QWEN_CONFIG, chat_templates.QWEN3, None,
              None, "<|im_end|>"),
    "qwen3-no-thinking": (QWEN_SPECIAL, QWEN_CONFIG, chat_templates.QWEN3,
                          {"enable_thinking": False}, None, "<|im_end|>"),
    "llama3.1": (LLAMA_SPECIAL, LLAMA_CONFIG, chat_templates.LLAMA31, None,
                 {"eos_token_id": [1, 4, 5]}, "<|eot_id|>"),
    "llama3.1-date": (LLAMA_SPECIAL, LLAMA_CONFIG, chat_templates.LLAMA31,
                      '{"date_string": "03 Feb 2025"}', None, "<|eot_id|>"),
    "gemma3": (GEMMA_SPECIAL, GEMMA_CONFIG, chat_templates.GEMMA3, None,
               {"eos_token_id": [1, 5]}, "<end_of_turn>"),
    "chatml-plain": (QWEN_SPECIAL, QWEN_CONFIG, chat_templates.CHATML_PLAIN,
                     None, None, "<|im_end|>"),
    "chatml-dashes": (QWEN_SPECIAL, QWEN_CONFIG, chat_templates.CHATML_DASHES,
                      None, None, "<|im_end|>"),
    "filters": (GEMMA_SPECIAL, GEMMA_CONFIG, chat_templates.FILTERS,
                {"extra": {"z": "<&>", "a": ["é", 1.5, None]}}, None, "<eos>"),
}


@pytest.fixture(scope="module")
def transformers_fast():
  transformers = pytest.importorskip("transformers")
  return transformers.PreTrainedTokenizerFast


def _reference(transformers_fast, directory, messages, kwargs):
  tok = transformers_fast.from_pretrained(directory)
  return tok.apply_chat_template(messages, tokenize=False,
                                 add_generation_prompt=True,
                                 **tokenizer_lib.parse_template_kwargs(kwargs))


@pytest.mark.parametrize("system", [None, SYSTEM])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_transformers(tmp_path, transformers_fast, name, system):
  special, config, template, kwargs, generation, end = CASES[name]
  path = write_checkpoint(str(tmp_path), special, config, template=template,
                          generation_config=generation)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat",
                                  system_prompt=system,
                                  template_kwargs=kwargs)
  messages = ([{"role": "system", "content": system}] if system else []) + [
      {"role": "user", "content": QUESTION}]
  expected = _reference(transformers_fast, str(tmp_path), messages, kwargs)
  assert tok.format_prompt(QUESTION) == expected
  assert tok.end_of_turn_id == tok.encode(end)[0]


def test_today_from_strftime_now(tmp_path, transformers_fast):
  path = write_checkpoint(str(tmp_path), LLAMA_SPECIAL, LLAMA_CONFIG,
                          template=chat_templates.LLAMA32_DATE)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  messages = [{"role": "user", "content": QUESTION}]
  for _ in range(2):  # A second try if the day changed in between.
    ours = tok.format_prompt(QUESTION)
    expected = _reference(transformers_fast, str(tmp_path), messages, None)
    if ours == expected:
      break
  assert ours == expected
  assert "Today Date: 26 Jul 2024" not in ours


def test_hand_rendered_prompts(tmp_path):
  """Known renderings (independent of transformers)."""
  path = write_checkpoint(str(tmp_path / "q"), QWEN_SPECIAL, QWEN_CONFIG,
                          template=chat_templates.QWEN3)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat",
                                  template_kwargs={"enable_thinking": False})
  assert tok.format_prompt("Hi") == (
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\n")
  path = write_checkpoint(str(tmp_path / "g"), GEMMA_SPECIAL, GEMMA_CONFIG,
                          template=chat_templates.GEMMA3)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat",
                                  system_prompt="Be brief.")
  assert tok.format_prompt(" Hi ") == (
      "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
      "<start_of_turn>model\n")
  path = write_checkpoint(str(tmp_path / "p"), QWEN_SPECIAL, QWEN_CONFIG,
                          template=chat_templates.CHATML_PLAIN)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  # trim_blocks drops the newline after each block tag and lstrip_blocks
  # the indentation before it; the newline after each `}}` stays.
  assert tok.format_prompt("Hi") == (
      "<|im_start|>user\nHi<|im_end|>\n\n<|im_start|>assistant\n\n")


def test_chat_template_jinja_file_takes_priority(tmp_path, transformers_fast):
  path = write_checkpoint(str(tmp_path), QWEN_SPECIAL, QWEN_CONFIG,
                          template="{{ 'from the config' }}",
                          jinja=chat_templates.QWEN25)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  expected = _reference(transformers_fast, str(tmp_path),
                        [{"role": "user", "content": QUESTION}], None)
  assert tok.format_prompt(QUESTION) == expected
  assert "You are Qwen" in expected


def test_named_templates_use_default(tmp_path, transformers_fast):
  named = [{"name": "tool_use", "template": "{{ 'tools' }}"},
           {"name": "default", "template": chat_templates.GEMMA3}]
  path = write_checkpoint(str(tmp_path), GEMMA_SPECIAL, GEMMA_CONFIG,
                          template=named)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  expected = _reference(transformers_fast, str(tmp_path),
                        [{"role": "user", "content": QUESTION}], None)
  assert tok.format_prompt(QUESTION) == expected
  assert expected.startswith("<bos><start_of_turn>user\n")


def test_missing_template_names_the_file(tmp_path):
  path = write_checkpoint(str(tmp_path), QWEN_SPECIAL, QWEN_CONFIG)
  config_path = os.path.join(str(tmp_path), "tokenizer_config.json")
  with pytest.raises(errors.InputError, match=f"{config_path}: no chat_templ"):
    tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  named = [{"name": "tool_use", "template": "x"}]
  path = write_checkpoint(str(tmp_path), QWEN_SPECIAL, QWEN_CONFIG,
                          template=named)
  with pytest.raises(errors.InputError, match=r"tool_use.*no \"default\""):
    tokenizer_lib.HFTokenizer(path, prompt_template="chat")


def test_template_errors_are_input_errors(tmp_path):
  path = write_checkpoint(str(tmp_path), GEMMA_SPECIAL, GEMMA_CONFIG,
                          template=chat_templates.GEMMA3)
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  with pytest.raises(errors.InputError, match="roles must alternate"):
    tok.render_chat([{"role": "assistant", "content": "x"}])
  path = write_checkpoint(str(tmp_path), GEMMA_SPECIAL, GEMMA_CONFIG,
                          template="{% if %}")
  with pytest.raises(errors.InputError, match="Jinja syntax error"):
    tokenizer_lib.HFTokenizer(path, prompt_template="chat")


@pytest.mark.parametrize("kwargs,match", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ({"messages": []}, "set by the prompt renderer"),
])
def test_bad_template_kwargs(tmp_path, kwargs, match):
  path = write_checkpoint(str(tmp_path), QWEN_SPECIAL, QWEN_CONFIG,
                          template=chat_templates.QWEN3)
  with pytest.raises(errors.InputError, match=match):
    tokenizer_lib.HFTokenizer(path, prompt_template="chat",
                              template_kwargs=kwargs)


def test_system_prompt_needs_chat(tmp_path):
  path = write_checkpoint(str(tmp_path), QWEN_SPECIAL, QWEN_CONFIG)
  with pytest.raises(ValueError, match="prompt_template='chat'"):
    tokenizer_lib.HFTokenizer(path, system_prompt="x")


def test_chat_prompts_get_no_extra_bos_and_sft_ends_the_turn(tmp_path):
  path = write_checkpoint(str(tmp_path), GEMMA_SPECIAL, GEMMA_CONFIG,
                          template=chat_templates.GEMMA3,
                          generation_config={"eos_token_id": [1, 5]})
  tok = tokenizer_lib.HFTokenizer(path, prompt_template="chat")
  bos, eos = tok.encode("<bos>")[0], tok.encode("<eos>")[0]
  end_of_turn = tok.encode("<end_of_turn>")[0]
  assert (tok.bos_id, tok.eos_id, tok.end_of_turn_id) == (bos, eos,
                                                          end_of_turn)
  batch = tokenizer_lib.encode_sft_batch(tok, ["Hi"], ["19"],
                                         max_prompt_len=24, max_len=32)
  prompt = tok.encode(tok.format_prompt("Hi"))
  assert prompt[0] == bos and prompt[1] != bos
  # The prompt is the template's rendering alone (its own BOS, no second).
  assert batch["attention_mask"][0, :24].sum() == len(prompt)
  np.testing.assert_array_equal(batch["tokens"][0, 24 - len(prompt):24],
                                prompt)
  response = batch["tokens"][0, 24:][batch["loss_mask"][0, 24:] == 1]
  assert response.tolist() == tok.encode("19") + [end_of_turn]
  assert tok.decode(response) == "19"
