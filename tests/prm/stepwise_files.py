"""What the file-PRM tests write: stepwise rows in each layout, and a tiny
random hub-format checkpoint with a chat template (no hub is reachable).

The tokenizer is word-level with runs of newlines kept as tokens of their
own ("\\n", "\\n\\n"), so that a response of K steps joined by either
delimiter has K steps by the token rule, as with the byte-level
vocabularies of released checkpoints.
"""

import json

import jax
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Regex
from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers
from tokenizers import trainers

from rl_rewards import models
from rl_rewards.models import tiny_hub
from tests.runners import gsm8k_files
from tests.tasks import chat_templates

SPECIAL_TOKENS = ["<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"]


def trl_rows(count: int = 8) -> list[dict]:
  """TRL stepwise rows: two or three steps, the last one wrong in odd rows."""
  return tiny_hub.stepwise_rows(count)


def math_shepherd_row(row: dict) -> dict:
  """A TRL row in Math-Shepherd's original layout (`input` / `label`)."""
  solution = "\n".join(f"Step {k + 1}: {s} {{tag}}"
                       for k, s in enumerate(row["completions"]))
  text = f"{row['prompt']} " + solution
  tags = iter("+" if y else "-" for y in row["labels"])
  label = text.replace("{tag}", "\0")
  label = "".join(next(tags) if c == "\0" else c for c in label)
  return {"input": text.replace("{tag}", "ки"), "label": label,
          "task": "GSM8K"}


def write(path, rows):
  """Writes rows as .jsonl, .json (a list) or .parquet, by the suffix."""
  path = str(path)
  if path.endswith(".jsonl"):
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
  elif path.endswith(".json"):
    with open(path, "w", encoding="utf-8") as f:
      json.dump(rows, f)
  else:
    pq.write_table(pa.Table.from_pylist(rows), path)
  return path


def tokenizer(extra_text: str = "") -> Tokenizer:
  """Word-level: newline runs are tokens, spaces separate words and
  vanish."""
  tok = Tokenizer(tok_models.WordLevel(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex("\n+"), "isolated"),
      pre_tokenizers.Split(Regex(" +"), "removed")])
  trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS)
  corpus = ([json.dumps(r) for r in trl_rows(16)] +
            [r["question"] + r["answer"] for r in gsm8k_files.ROWS] +
            ["Q: now? Step 1: 2: 3: 4: so \n system user assistant You are Qwen, "
             "created by Alibaba Cloud. a helpful", extra_text])
  tok.train_from_iterator(corpus, trainer)
  return tok


def checkpoint(root) -> str:
  """A tiny random Qwen2 checkpoint directory with the Qwen2.5 template."""
  root.mkdir(parents=True, exist_ok=True)
  tok = tokenizer()
  tok.save(str(root / "tokenizer.json"))
  (root / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": None, "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>", "chat_template": chat_templates.QWEN25}))
  model_config = models.preset("test", tok.get_vocab_size())
  params = models.init_params(model_config, jax.random.key(0))
  models.save_hf(str(root), model_config, params)
  return str(root)


def gsm8k_task_files(root) -> dict:
  """GSM8K-layout problems for the task the PRM and RL runs share."""
  root.mkdir(parents=True, exist_ok=True)
  train, evalf = root / "train.jsonl", root / "test.jsonl"
  write(train, gsm8k_files.ROWS[:8])
  write(evalf, gsm8k_files.ROWS[8:])
  return {"train": str(train), "eval": str(evalf)}
