"""`python -m experiments.make_tiny_hub`: a checkpoint the loaders read, and
a training command that runs on it."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import tokenizers

from experiments import make_tiny_hub
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.data import readers
from rl_rewards.models import tiny_hub
from rl_rewards.runners import pipeline
from rl_rewards.tasks import tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _printed_command(stdout):
  """The argv of the `python -m experiments.train ...` command printed."""
  text = stdout[stdout.index("python -m experiments.train"):]
  return shlex.split(text.replace("\\\n", " "))


def _make(out, family):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.make_tiny_hub", f"--out={out}",
       f"--family={family}"], cwd=ROOT, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 0, result.stderr
  return result.stdout


def _config(args):
  """The config the printed command's flags make (as `cli.run` does)."""
  spec = next(a for a in args if a.startswith("--config="))
  config = cli.load_config_file(os.path.join(ROOT, spec.split("=", 1)[1]))
  for arg in args:
    if arg.startswith("--config."):
      key, value = arg[len("--config."):].split("=", 1)
      cli.check_override_key(config, key)
      *parents, leaf = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      setattr(node, leaf, type(node[leaf])(value))
  config_lib.validate(config)
  return config


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_checkpoint_loads_and_the_command_is_a_valid_run(family,
                                                             tmp_path):
  out = str(tmp_path / "hub")
  info, files = make_tiny_hub.write(out, family)
  stdout = make_tiny_hub.report(out, family, info, files)
  checkpoint = tmp_path / "hub" / "checkpoint"
  assert sorted(os.listdir(checkpoint)) == [
      "config.json", "generation_config.json", "model.safetensors",
      "tokenizer.json", "tokenizer_config.json"]
  assert "config.json, generation_config.json, model.safetensors" in stdout
  # The project's loaders read it: the model with its padded vocabulary,
  # the tokenizer with the template's stop token and chat template.
  model_config, params = models.load_hf(str(checkpoint))
  spec = tiny_hub.FAMILIES[family]
  with open(checkpoint / "config.json") as f:
    assert json.load(f)["model_type"] == spec.hf_config["model_type"]
  assert model_config.architecture == family
  assert model_config == info.model_config
  assert params["embed"].shape[0] == model_config.vocab_size
  tokenizer = tokenizer_lib.HFTokenizer(str(checkpoint / "tokenizer.json"),
                                        prompt_template="chat")
  assert model_config.vocab_size == tokenizer.vocab_size + 5
  vocabulary = tokenizers.Tokenizer.from_file(
      str(checkpoint / "tokenizer.json"))
  end_of_turn = vocabulary.token_to_id(spec.end_of_turn)
  assert tokenizer.end_of_turn_id == end_of_turn
  assert end_of_turn in tokenizer.stop_ids
  prompt = tokenizer.format_prompt("Tom has 2 apples.")
  assert prompt.count("Tom has 2 apples.") == 1
  # Every word of the prompt is in the vocabulary.
  assert vocabulary.token_to_id("<unk>") not in tokenizer.encode(prompt)
  rows = readers.read_records(files["train"], readers.PRESETS["gsm8k"])
  assert len(rows) == 8 and rows[0]["answer"] == "5"
  assert f"{files['test']} (2 rows)" in stdout
  # The printed command: train on these files at smoke size.
  args = _printed_command(stdout)
  assert args[:3] == ["python", "-m", "experiments.train"]
  config = _config(args[3:])
  assert config.model.hf_path == str(checkpoint)
  assert config.rl.steps == 2 and config.task.prompt_template == "chat"
  assert f"--workdir={out}/run" in args
  pipeline.check_stages(config, f"{out}/run")


@pytest.mark.slow
def test_the_printed_command_trains_on_the_tiny_checkpoint(tmp_path):
  out = tmp_path / "hub"
  args = _printed_command(_make(out, "gemma3_text"))
  result = subprocess.run([sys.executable] + args[1:], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = metrics_lib.read_json(str(out / "run" / "summary.json"))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  assert "=== summary ===" in result.stdout


# The prompt each family's template renders for a system prompt and a
# question, as the released checkpoints' templates lay it out.
_PROMPTS = {
    "qwen2": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
             "Tom has 2 apples.<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
             "Tom has 2 apples.<|im_end|>\n<|im_start|>assistant\n"
             "<think>\n\n</think>\n\n",
    "llama": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
             "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
             "Tom has 2 apples.<|eot_id|><|start_header_id|>assistant"
             "<|end_header_id|>\n\n",
    "mistral": "<s>[INST] Tom has 2 apples. [/INST]",
    "gemma3_text": "<bos><start_of_turn>user\nBe brief.\n\nTom has 2 apples."
                   "<end_of_turn>\n<start_of_turn>model\n",
}


def test_every_family_renders_its_chat_layout(tmp_path):
  assert set(_PROMPTS) == set(tiny_hub.FAMILIES)
  for family, expected in _PROMPTS.items():
    spec = tiny_hub.FAMILIES[family]
    path = tmp_path / family
    path.mkdir()
    tokenizer = tiny_hub.word_level_tokenizer(spec.special_tokens)
    tokenizer.save(str(path / "tokenizer.json"))
    tiny_hub.write_tokenizer_config(
        str(path), chat_template=spec.chat_template, bos_token=spec.bos_token,
        eos_token=spec.eos_token, pad_token=spec.special_tokens[0])
    ours = tokenizer_lib.HFTokenizer(
        str(path / "tokenizer.json"), prompt_template="chat",
        system_prompt="Be brief." if spec.system_prompt else None,
        template_kwargs=('{"enable_thinking": false}' if family == "qwen3"
                         else None))
    assert ours.format_prompt("Tom has 2 apples.") == expected, family
    assert ours.end_of_turn_id == tokenizer.token_to_id(spec.end_of_turn)


def test_prm_data_writes_the_loop_files_and_valid_commands(tmp_path):
  out = str(tmp_path / "hub")
  info, files = make_tiny_hub.write(out, "qwen2", prm_data=True)
  # The tokenizer keeps newline runs: K steps joined by a blank line are K
  # steps by the token rule (the delimiter is one token of its own).
  tok = tokenizers.Tokenizer.from_file(os.path.join(info.path,
                                                    "tokenizer.json"))
  rows = list(readers.iter_json_lines(files["prm_train"]))
  steps = rows[1][1]["completions"]
  assert len(steps) == 3 and rows[1][1]["labels"] == [True, True, False]
  ids = tok.encode("\n\n".join(steps)).ids
  assert ids.count(tok.token_to_id("\n\n")) == 2
  assert tok.token_to_id("<unk>") not in ids
  # ProcessBench rows: the first wrong step's index, -1 when none.
  bench = [r for _, r in readers.iter_json_lines(files["processbench"])]
  assert [r["label"] for r in bench[:2]] == [-1, 2]
  assert bench[1]["steps"] == steps and not bench[1]["final_answer_correct"]
  commands = make_tiny_hub.prm_loop_commands(out, "qwen2")
  assert [c[1][0] for c in commands] == [
      "python -m experiments.train", "python -m experiments.eval_prm",
      "python -m experiments.eval_prm", "python -m experiments.train"]
  # Both training commands make valid configs whose files exist.
  for _, command in (commands[0], commands[3]):
    config = _config(command[1:])
    for path in (config.model.hf_path, config.task.train_path,
                 config.task.eval_path):
      assert os.path.exists(path), path
  assert _config(commands[0][1][1:]).prm.train_path == files["prm_train"]
  assert _config(commands[3][1][1:]).prm.init_from == os.path.join(out,
                                                                "prm_run")
