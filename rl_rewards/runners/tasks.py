"""The task as the runner sees it: problems, prompts, references and scores.

A thin adapter over `rl_rewards.tasks` so that the stages never touch a
particular task's module: they ask for problems of a split, format prompts,
get reference solutions for SFT, and score decoded responses (outcome reward
plus the ground-truth step labels when the task has them).
"""

import dataclasses

import numpy as np

from rl_rewards.tasks import arith
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib

# Problem indices of the RL prompt stream start here, so RL never sees the
# problems SFT was trained on (both come from the "train" split).
RL_INDEX_OFFSET = 10_000_000


@dataclasses.dataclass(frozen=True)
class Scored:
  """Verdicts for a batch of responses (host numpy arrays)."""
  rewards: np.ndarray          # [N] float32 outcome rewards.
  num_steps: np.ndarray        # [N] int32 steps in each response.
  first_error: np.ndarray      # [N] int32, -1 when every step is correct.
  empty_steps: np.ndarray      # [N] int32 steps with no text.
  step_labels: list            # N lists of bools (ground-truth step labels).


class ArithTask:
  """The embedded arithmetic task (DESIGN §6)."""

  def __init__(self, task_config, seed: int):
    self.config = arith.ArithConfig(
        min_ops=task_config.min_ops, max_ops=task_config.max_ops,
        max_value=task_config.max_value, fixed_width=task_config.fixed_width,
        seed=seed)
    self.delimiter = task_config.delimiter
    self.tokenizer = tokenizer_lib.CharTokenizer()
    self.max_prompt_len = task_config.max_prompt_len
    self.max_new_tokens = task_config.max_new_tokens

  @property
  def ops_range(self):
    return range(self.config.min_ops, self.config.max_ops + 1)

  def problems(self, split: str, start: int, count: int):
    return arith.make_problems(self.config, split, range(start, start + count))

  def problems_per_k(self, split: str, size_per_k: int):
    """`size_per_k` problems for each number of operations, k-major."""
    out = []
    for k in self.ops_range:
      config_k = dataclasses.replace(self.config, min_ops=k, max_ops=k)
      out.extend(arith.make_problems(config_k, split, range(size_per_k)))
    return out

  def num_ops(self, problems) -> np.ndarray:
    return np.array([p.num_ops for p in problems], np.int32)

  def prompts(self, problems) -> list[str]:
    return [p.question for p in problems]

  def references(self, problems) -> list[str]:
    return [arith.reference_solution(p, self.delimiter) for p in problems]

  def encode_prompts(self, problems):
    return tokenizer_lib.encode_prompts(
        self.tokenizer, self.prompts(problems), self.max_prompt_len)

  def encode_sft(self, problems):
    return tokenizer_lib.encode_sft_batch(
        self.tokenizer, self.prompts(problems), self.references(problems),
        max_prompt_len=self.max_prompt_len,
        max_len=self.max_prompt_len + self.max_new_tokens)

  def delimiter_mask(self) -> np.ndarray:
    return self.tokenizer.delimiter_mask(self.delimiter)

  def decode_responses(self, tokens: np.ndarray, response_mask: np.ndarray):
    """Response texts (without EOS) of sampled rows [N, P + G]."""
    texts = []
    for row, mask in zip(tokens, response_mask):
      texts.append(self.tokenizer.decode(row[mask.astype(bool)]))
    return texts

  def score(self, problems, texts, finished) -> Scored:
    """Outcome rewards and ground-truth step labels of decoded responses."""
    n = len(texts)
    rewards = np.zeros((n,), np.float32)
    num_steps = np.zeros((n,), np.int32)
    first_error = np.zeros((n,), np.int32)
    empty = np.zeros((n,), np.int32)
    labels = []
    for i, (problem, text, done) in enumerate(zip(problems, texts, finished)):
      verdict = arith.check_solution(problem, text, self.delimiter)
      rewards[i] = float(bool(done) and verdict.answer_correct)
      num_steps[i] = verdict.num_steps
      first_error[i] = verdict.first_error
      empty[i] = sum(1 for step in self.split_steps(text) if not step)
      labels.append(verdict.labels)
    return Scored(rewards=rewards, num_steps=num_steps,
                  first_error=first_error, empty_steps=empty,
                  step_labels=labels)

  def split_steps(self, text: str) -> list[str]:
    return segmentation.split_steps(text, self.delimiter)


def make_task(task_config, seed: int):
  """Builds the task named by `config.task.name`."""
  if task_config.name == "arith":
    return ArithTask(task_config, seed)
  raise ValueError(f"config.task.name: unknown task {task_config.name!r}.")
