"""Step-labelled files as PRM training data: rows -> label records.

`configs/prm.py:data=file` trains a verifier on `prm.train_path` (and
`prm.valid_path`) instead of the Monte-Carlo labels stage's output. Each row
(`rl_rewards/data/stepwise.py`: TRL's stepwise layout or Math-Shepherd's)
becomes the same label record the labels stage writes (`label_store`), so
the one trainer (`prm_stages.run_prm_train`) serves both.
"""

import jax
import numpy as np

from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards.data import stepwise
from rl_rewards.prm import scoring
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib


def file_fields(config) -> stepwise.StepwiseFields:
  """The layout of `prm.train_path` / `prm.valid_path` (`prm.preset`,
  `prm.fields`)."""
  try:
    return stepwise.field_map(config.prm.preset, config.prm.fields)
  except ValueError as e:
    raise config_lib.ConfigError(f"config.prm.fields: {e}") from None


# One program per shape, not one per operation.
_num_steps = jax.jit(segmentation.num_steps_from_tokens,
                     static_argnames=("eos_id",))


def records_from_examples(examples, *, tokenizer, delimiter: str,
                          delimiter_mask, max_prompt_len: int,
                          max_new_tokens: int, split: str) -> list[dict]:
  """Parsed stepwise rows -> label records (`label_store`), tokenized.

  The prompt is rendered and encoded exactly as the sampler's prompts are
  (`tokenizer.encode_prompts`: the task's prompt template, the checkpoint's
  chat template with `task.prompt_template="chat"`); the response is the
  steps joined with the delimiter (`segmentation.join_steps`) and then the
  end-of-turn token, as an SFT target and a finished rollout end. The
  response must have as many steps by the token rule
  (`segmentation.num_steps_from_tokens`) as the row has labels.

  Args:
    examples: (where, `stepwise.parse_row` dict) pairs.
    tokenizer: the task's tokenizer.
    delimiter: the step delimiter.
    delimiter_mask: bool [V] delimiter tokens (`task.delimiter_mask()`).
    max_prompt_len: P.
    max_new_tokens: G.
    split: the records' `split` ("train" or "valid").

  Returns:
    Records with the file's labels: `q` the soft and `hard` the hard step
    labels, `rollouts` 0 (no continuations behind them), no V̂ (`v` None),
    no oracle; `index` is the row's position in its file.

  Raises:
    errors.InputError naming the file and row of the first row whose prompt
    or response does not fit P / G, or whose steps the tokenizer merges.
  """
  records = []
  for index, (where, example) in enumerate(examples):
    text = segmentation.join_steps(example["steps"], delimiter)
    try:
      tokens, mask = tokenizer_lib.encode_prompts(
          tokenizer, [example["prompt"]], max_prompt_len)
      response = tokenizer.encode(text) + [tokenizer.end_of_turn_id]
    except errors.InputError as e:
      raise errors.InputError(
          f"{where}: {e} Raise config.task.max_prompt_len.") from None
    except ValueError as e:  # Text the tokenizer cannot encode.
      raise errors.InputError(f"{where}: {e}") from None
    if len(response) > max_new_tokens:
      raise errors.InputError(
          f"{where}: the solution has {len(response)} tokens (with the end "
          f"token), more than config.task.max_new_tokens={max_new_tokens}.")
    k = len(example["steps"])
    records.append(dict(
        split=split, index=index, question=example["prompt"],
        prompt_ids=[int(t) for t in tokens[0][mask[0] == 1]],
        response_ids=[int(t) for t in response], text=text, finished=True,
        outcome=float(example["outcome"]), q=list(example["q"]),
        hard=list(example["hard"]), rollouts=[0] * k, v=None, v_rollouts=0,
        oracle=None, first_error=None))
  if records:
    tokens, _, response_mask = scoring.layout_solutions(
        [r["prompt_ids"] for r in records],
        [r["response_ids"] for r in records], prompt_width=max_prompt_len,
        response_budget=max_new_tokens, pad_id=tokenizer.pad_id)
    counts = np.asarray(_num_steps(
        tokens, response_mask, np.asarray(delimiter_mask, bool),
        eos_id=tokenizer.stop_ids))
    for (where, _), record, count in zip(examples, records, counts):
      if count != len(record["hard"]):
        raise errors.InputError(
            f"{where}: {len(record['hard'])} steps, but the tokenizer cuts "
            f"the joined solution into {count} (a token spans the step "
            f"delimiter {delimiter!r} and its neighbours); use another "
            "config.task.delimiter.")
  return records


def file_label_records(ctx, key: str) -> list[dict]:
  """The label records of `prm.<key>` (train_path or valid_path).

  Raises:
    ConfigError naming the key, the file and the row at fault.
  """
  config, task = ctx.config, ctx.task
  path = config.prm[key]
  try:
    examples = stepwise.read_examples(path, file_fields(config),
                                      task.delimiter)
    return records_from_examples(
        examples, tokenizer=task.tokenizer, delimiter=task.delimiter,
        delimiter_mask=task.delimiter_mask(),
        max_prompt_len=task.max_prompt_len,
        max_new_tokens=task.max_new_tokens,
        split="train" if key == "train_path" else "valid")
  except errors.InputError as e:
    raise config_lib.ConfigError(f"config.prm.{key}: {e}") from None
