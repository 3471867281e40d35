"""grain pipelines: fixed-shape numpy batches with random access by index.

A pipeline is a `grain.MapDataset` whose element i is batch i, so a
trainer's data position is one integer and resuming is exact: after k steps,
the next batch is `dataset[k]`, whatever happened before.

  source --shuffle(seed)--> repeat (reshuffled each epoch) --map(encode)-->
  batch(batch_size, drop_remainder=True)

Sources are any random-access sequences of records (dicts with `question`,
`answer`, `solution`, `index`; strings may be bytes), e.g. a tfds
`data_source` from `rl_rewards.data.builders`, or `ArithProblemSource`, which
generates arithmetic problems on demand (no preparation, unbounded size).

Batches are dicts of numpy arrays:

  prompt batches: tokens int32 [B, P], prompt_mask int32 [B, P],
                  question [B] str, answer [B] str, index int64 [B]
  SFT batches:    tokens, loss_mask, attention_mask int32 [B, T], plus the
                  same question, answer and index

with the prompt layout of `rl_rewards.tasks.tokenizer`.
"""

from typing import Any, Optional, Sequence

import grain
import numpy as np

from rl_rewards.tasks import arith
from rl_rewards.tasks import tokenizer as tokenizer_lib

# Size of an "unbounded" ArithProblemSource (problem indices are int64).
UNBOUNDED_SIZE = 2**62


class ArithProblemSource(Sequence):
  """Arithmetic problems of one split, generated on access.

  Record i is `arith.make_problem(task, i, split)`: question, answer (str),
  solution (the reference solution), index (the problem index) and num_ops.
  """

  def __init__(self, task: arith.ArithConfig, split: str,
               size: int = UNBOUNDED_SIZE):
    if size < 1:
      raise ValueError(f"size must be >= 1, got {size}.")
    self.task = task
    self.split = split
    self.size = size

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = int(index)
    if not 0 <= index < self.size:
      raise IndexError(f"index {index} out of range [0, {self.size}).")
    problem = arith.make_problem(self.task, index, self.split)
    return {"question": problem.question, "answer": str(problem.answer),
            "solution": arith.reference_solution(problem), "index": index,
            "num_ops": problem.num_ops}


def as_text(value) -> str:
  """A string field of a tfds/grain record (bytes or 0-d array) as str."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray) and value.shape == ():
    return as_text(value.item())
  return str(value)


def _metadata(record) -> dict[str, Any]:
  return {"question": as_text(record["question"]),
          "answer": as_text(record["answer"]),
          "index": np.int64(record["index"])}


def _ordered(source, seed: Optional[int], num_epochs: Optional[int]):
  dataset = grain.MapDataset.source(source)
  if seed is not None:
    dataset = dataset.shuffle(seed=seed)
  if num_epochs != 1:
    dataset = dataset.repeat(num_epochs)
  return dataset


def prompt_dataset(source, tokenizer: tokenizer_lib.Tokenizer, *,
                   batch_size: int, max_prompt_len: int,
                   seed: Optional[int] = None,
                   num_epochs: Optional[int] = None) -> grain.MapDataset:
  """Batches of left-padded prompts plus metadata (for sampling/eval).

  Args:
    source: random-access records with question, answer, index.
    tokenizer: the tokenizer.
    batch_size: B.
    max_prompt_len: P; a longer prompt raises ValueError when its batch is
      read.
    seed: shuffle seed, or None to keep source order (e.g. for evaluation
      or for `ArithProblemSource`, which is already random).
    num_epochs: passes over the source (None: unbounded). Each epoch is
      reshuffled. Incomplete final batches are dropped.

  Returns:
    A MapDataset; element i is batch i.
  """
  _check_batch_size(batch_size)

  def encode(record):
    out = _metadata(record)
    tokens, mask = tokenizer_lib.encode_prompts(tokenizer, [out["question"]],
                                                max_prompt_len)
    out["tokens"], out["prompt_mask"] = tokens[0], mask[0]
    return out

  return _ordered(source, seed, num_epochs).map(encode).batch(
      batch_size, drop_remainder=True)


def sft_dataset(source, tokenizer: tokenizer_lib.Tokenizer, *,
                batch_size: int, max_prompt_len: int, max_len: int,
                seed: Optional[int] = None,
                num_epochs: Optional[int] = None) -> grain.MapDataset:
  """Batches of prompt + reference solution for supervised fine-tuning.

  Args:
    source: random-access records with question, answer, solution, index.
    tokenizer: the tokenizer.
    batch_size: B.
    max_prompt_len: P, the left-padded prompt width.
    max_len: T, the total width.
    seed: shuffle seed, or None to keep source order.
    num_epochs: passes over the source (None: unbounded).

  Returns:
    A MapDataset; element i is batch i.
  """
  _check_batch_size(batch_size)

  def encode(record):
    out = _metadata(record)
    batch = tokenizer_lib.encode_sft_batch(
        tokenizer, [out["question"]], [as_text(record["solution"])],
        max_prompt_len=max_prompt_len, max_len=max_len)
    out.update({key: value[0] for key, value in batch.items()})
    return out

  return _ordered(source, seed, num_epochs).map(encode).batch(
      batch_size, drop_remainder=True)


def _check_batch_size(batch_size: int) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
