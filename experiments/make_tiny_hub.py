"""Writes a tiny random checkpoint in the hub's layout and GSM8K-format data.

    python -m experiments.make_tiny_hub --out=runs/tiny_hub --family=llama

To try the real-model path (`configs/qwen_gsm8k.py`) without downloading
anything: `<out>/checkpoint/` holds config.json, random weights
(model.safetensors), tokenizer.json, tokenizer_config.json with a chat
template and generation_config.json of a ~20k-parameter model of the family
(`qwen2`, `qwen3`, `llama`, `mistral` or `gemma3_text`; a vocabulary padded
beyond the tokenizer's, as released checkpoints have), and
`<out>/gsm8k/{train,test}.jsonl` hold GSM8K-format rows (`question`,
`answer` ending in "#### x"). The command prints the training command to
run next: `configs/qwen_gsm8k.py:smoke` on these files, a minute or two on
CPU. Accuracy stays near zero (the weights are random): it checks the
plumbing, as a real checkpoint's first run would.

With `--prm_data` it also writes `<out>/prm/train.jsonl` (step-labelled
solutions in TRL's stepwise layout) and `<out>/prm/processbench.jsonl` (the
same solutions in ProcessBench's layout), gives the tokenizer newline tokens
so that steps can be cut, and prints the commands of the PRM loop on them:
train a PRM from the file, evaluate it in ProcessBench's format, Best-of-N
on the GSM8K file, and RL with it as the process reward
(docs/prm_files.md).
"""

import os
import shlex

from absl import app
from absl import flags
from absl import logging

from rl_rewards import cli
from rl_rewards import models
from rl_rewards.models import tiny_hub

_OUT = flags.DEFINE_string(
    "out", None, "Directory to write: <out>/checkpoint, <out>/gsm8k and, "
    "for the printed command, <out>/run.",
    allow_override=True)  # Other entry points have an --out too.
_FAMILY = flags.DEFINE_enum(
    "family", "qwen2", sorted(tiny_hub.FAMILIES),
    "Architecture family of the checkpoint.")
_PRM_DATA = flags.DEFINE_bool(
    "prm_data", False, "Also write step-labelled PRM files and print the "
    "PRM loop's commands on them.")
flags.mark_flag_as_required("out")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_path():
  """configs/qwen_gsm8k.py, relative when run from the repository root."""
  relative = os.path.join("configs", "qwen_gsm8k.py")
  if os.path.exists(relative):
    return relative
  return os.path.join(_ROOT, relative)


def train_args(out: str, family: str) -> list:
  """The arguments of the training command on what `write` wrote."""
  checkpoint, data = os.path.join(out, "checkpoint"), os.path.join(out, "gsm8k")
  args = [f"--config={_config_path()}:smoke",
          f"--config.model.hf_path={checkpoint}",
          f"--config.task.train_path={os.path.join(data, 'train.jsonl')}",
          f"--config.task.eval_path={os.path.join(data, 'test.jsonl')}",
          "--config.task.prompt_template=chat"]
  if family == "qwen3":
    args.append('--config.task.chat_template_kwargs={"enable_thinking": '
                'false}')
  return args + [f"--workdir={os.path.join(out, 'run')}"]


def write(out: str, family: str, prm_data: bool = False):
  """Writes the checkpoint and data; returns (TinyCheckpoint, data files)."""
  extra = tiny_hub.DEFAULT_EXTRA_TEXT + (
      " " + tiny_hub.STEPWISE_TEXT if prm_data else "")
  info = tiny_hub.write_checkpoint(os.path.join(out, "checkpoint"), family,
                                   extra_text=extra, newline_tokens=prm_data)
  files = tiny_hub.write_gsm8k(os.path.join(out, "gsm8k"))
  if prm_data:
    files.update(tiny_hub.write_prm_data(os.path.join(out, "prm")))
  return info, files


def prm_loop_commands(out: str, family: str) -> list:
  """The PRM loop on what `write(prm_data=True)` wrote: [(what, command)]."""
  checkpoint, data = os.path.join(out, "checkpoint"), os.path.join(out, "gsm8k")
  prm_dir, run = os.path.join(out, "prm"), os.path.join(out, "prm_run")
  task = [f"--config.model.hf_path={checkpoint}",
          f"--config.task.train_path={os.path.join(data, 'train.jsonl')}",
          f"--config.task.eval_path={os.path.join(data, 'test.jsonl')}"]
  if family == "qwen3":
    task.append('--config.task.chat_template_kwargs={"enable_thinking": '
                'false}')
  config = os.path.join(os.path.dirname(_config_path()), "prm.py")
  train = ["python -m experiments.train",
           f"--config={config}:data=file,model=head,size=test", *task,
           f"--config.prm.train_path={os.path.join(prm_dir, 'train.jsonl')}",
           f"--workdir={run}"]
  processbench = ["python -m experiments.eval_prm", f"--workdir={run}",
                  "--processbench="
                  f"{os.path.join(prm_dir, 'processbench.jsonl')}"]
  best_of_n = ["python -m experiments.eval_prm", f"--workdir={run}",
               f"--bon_path={os.path.join(data, 'test.jsonl')}",
               "--bon_samples=4"]
  rl = ["python -m experiments.train", f"--config={_config_path()}:smoke",
        *task, "--config.task.prompt_template=chat",
        "--config.rl.method=pure", "--config.rl.prm_source=model",
        f"--config.prm.init_from={run}",
        f"--workdir={os.path.join(out, 'pure_run')}"]
  return [("Train a score-head PRM from the step-labelled file", train),
          ("Its first-error F1 on the ProcessBench-format file",
           processbench),
          ("Best-of-4 with it on the GSM8K file", best_of_n),
          ("RL (PURE) with it as the process reward", rl)]


def command_text(args, program: str = "python -m experiments.train") -> str:
  """`program` with `args`, one argument a line."""
  lines = [program]
  lines += [f"    {shlex.quote(arg)}" for arg in args]
  return " \\\n".join(lines)


def report(out: str, family: str, info, files) -> str:
  """What the command prints: what it wrote and the command to run next."""
  padding = info.model_config.vocab_size - info.tokenizer_vocab_size
  rows = {}
  for path in files.values():
    with open(path, encoding="utf-8") as f:
      rows[path] = sum(1 for _ in f)
  return "\n".join([
      f"Wrote a tiny random {family} checkpoint "
      f"({models.num_params(info.model_config):,} parameters; "
      f"{info.tokenizer_vocab_size} tokens + {padding} padding rows) to "
      f"{info.path}/:",
      "  " + ", ".join(sorted(os.listdir(info.path))),
      "and GSM8K-format data: " + ", ".join(
          f"{files[k]} ({rows[files[k]]} rows)" for k in ("train", "test")),
      *([f"and PRM files: {files['prm_train']} (stepwise, "
         f"{rows[files['prm_train']]} rows), {files['processbench']} "
         f"(ProcessBench layout)"] if "processbench" in files else []),
      "",
      "Train on them at smoke size (a minute or two on CPU; the weights are "
      "random, so accuracy stays near 0):",
      "",
      command_text(train_args(out, family))] + [
          line for what, command in (prm_loop_commands(out, family)
                                     if "processbench" in files else [])
          for line in ("", what + ":", "",
                       command_text(command[1:], program=command[0]))])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # jax's backend INFO lines.
  info, files = write(_OUT.value, _FAMILY.value, _PRM_DATA.value)
  print(report(_OUT.value, _FAMILY.value, info, files), flush=True)


if __name__ == "__main__":
  cli.define_debug_flag()
  app.run(cli.reporting_errors(main))
