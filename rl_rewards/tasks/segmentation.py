"""Step segmentation: the one place where responses are cut into steps.

PRM training, PRM scoring, credit assignment and search all use these
functions, so a "step" means the same thing everywhere. There are two views
of the same rule, one on text and one on tokens, and they agree.

Text rule (`split_steps`), for a decoded response without EOS:

  * The text is split on every occurrence of the delimiter (default "\\n").
  * Empty steps are kept: "a\\n\\nb" -> ["a", "", "b"].
  * A trailing delimiter closes the last step and does NOT open a new, empty
    one: "a\\nb\\n" -> ["a", "b"], "a\\n\\n" -> ["a", ""], "\\n" -> [""].
  * Every text has at least one step: "" -> [""], "abc" -> ["abc"].

Token rule (`step_ends_from_tokens`), for a batch of padded responses
`tokens[B, T]` with `response_mask[B, T]` (1 on generated tokens up to and
including EOS; assumed contiguous):

  * A valid response token ends a step if it is a delimiter token
    (`delimiter_mask[token]`), or if it is the last valid token of its row.
  * Exception, mirroring the trailing-delimiter text rule: a delimiter token
    that is directly followed by a final EOS does not end a step; the EOS
    joins the step the delimiter would have closed. So "a\\n<EOS>" is one
    step, like the text "a\\n".
  * Step ids count the step ends strictly before a token,
    `step_id[t] = #{t' < t : step_end[t']}` (docs/algorithms.md), so the
    delimiter belongs to the step it ends; off-response tokens get -1.
  * A row without valid response tokens has no steps.

With a tokenizer where a delimiter token is exactly the delimiter character
(the character tokenizer), the two rules agree for every text: the number of
token steps equals `len(split_steps(text))`, and the tokens of step k decode to
text step k followed by at most one delimiter. For subword vocabularies a
token may hold the delimiter together with other characters (e.g. ".\\n\\n");
the token rule then cuts at the end of that token, which is the convention of
PURE (any token whose decoded text contains the delimiter ends a step).
"""

from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_DELIMITER = "\n"


def _check_delimiter(delimiter: str) -> None:
  if not isinstance(delimiter, str) or not delimiter:
    raise ValueError(
        f"delimiter must be a non-empty string, got {delimiter!r}.")


def split_steps(text: str, delimiter: str = DEFAULT_DELIMITER) -> list[str]:
  """Splits a response text into steps (see the module docstring for rules).

  Args:
    text: the decoded response, without EOS.
    delimiter: the step delimiter, a non-empty string.

  Returns:
    The list of steps (without delimiters), at least one element.
  """
  _check_delimiter(delimiter)
  steps = text.split(delimiter)
  if len(steps) > 1 and not steps[-1]:
    steps.pop()
  return steps


def num_text_steps(text: str, delimiter: str = DEFAULT_DELIMITER) -> int:
  """`len(split_steps(text, delimiter))` without building the list."""
  _check_delimiter(delimiter)
  count = text.count(delimiter) + 1
  if count > 1 and text.endswith(delimiter):
    count -= 1
  return count


def join_steps(steps: Sequence[str],
               delimiter: str = DEFAULT_DELIMITER) -> str:
  """Joins steps with the delimiter (no trailing delimiter).

  `split_steps(join_steps(s)) == s` whenever no step contains the delimiter
  and the last step is non-empty (or `s` has a single element);
  `join_steps(split_steps(t)) == t` whenever `t` does not end with the
  delimiter.

  Args:
    steps: the steps, none of which should contain the delimiter.
    delimiter: the step delimiter.

  Returns:
    The response text.
  """
  _check_delimiter(delimiter)
  return delimiter.join(steps)


def eos_id_tuple(eos_id) -> Tuple[int, ...]:
  """The end-of-sequence ids as a tuple: None -> (), an int -> (id,), a
  sequence of ints -> its distinct ids in order."""
  if eos_id is None:
    return ()
  if isinstance(eos_id, (int, np.integer)) and not isinstance(eos_id, bool):
    return (int(eos_id),)
  try:
    ids = list(eos_id)
  except TypeError:
    raise ValueError(f"eos_id must be an int token id, a sequence of them or "
                     f"None, got {eos_id!r}.") from None
  out = []
  for i in ids:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
      raise ValueError(f"eos_id must hold int token ids, got {eos_id!r}.")
    if int(i) not in out:
      out.append(int(i))
  return tuple(out)


def step_ends_from_tokens(tokens: jax.Array,
                          response_mask: jax.Array,
                          delimiter_mask: jax.Array,
                          *,
                          eos_id) -> jax.Array:
  """Marks the tokens that end a step.

    step_end[b, t] = valid[b, t] and (is_last[b, t] or
                     (is_delim[b, t] and not (is_last[b, t+1] and
                                              tokens[b, t+1] in eos_ids)))

  where valid = response_mask > 0, is_last marks the last valid token of a row
  and is_delim = delimiter_mask[tokens]. Jittable; `eos_id` is static.

  Args:
    tokens: int [B, T] token ids (prompt, response and padding).
    response_mask: [B, T] 1 (or True) on response tokens up to and including
      EOS, contiguous within a row.
    delimiter_mask: bool [V], True for tokens that end a step (see
      `CharTokenizer.delimiter_mask`). Token ids outside [0, V) count as
      non-delimiters.
    eos_id: the EOS token id, a sequence of ids that all end a response
      (`HFTokenizer.stop_ids`), or None if responses never end in EOS (then
      a trailing delimiter simply ends the final step).

  Returns:
    bool [B, T], True on the last token of every step.
  """
  tokens = jnp.asarray(tokens)
  valid = jnp.asarray(response_mask) > 0
  delimiter_mask = jnp.asarray(delimiter_mask, dtype=bool)
  if tokens.ndim != 2 or valid.shape != tokens.shape:
    raise ValueError(
        "tokens and response_mask must both be [B, T]; got shapes "
        f"{tokens.shape} and {valid.shape}.")
  if delimiter_mask.ndim != 1:
    raise ValueError(
        f"delimiter_mask must be [V]; got shape {delimiter_mask.shape}.")
  vocab_size = delimiter_mask.shape[0]
  in_vocab = (tokens >= 0) & (tokens < vocab_size)
  is_delim = jnp.where(
      in_vocab, delimiter_mask[jnp.clip(tokens, 0, vocab_size - 1)], False)
  # A token is the last valid one if no valid token follows it.
  valid_from_here = jnp.cumsum(valid[:, ::-1].astype(jnp.int32),
                               axis=1)[:, ::-1]
  is_last = valid & (valid_from_here == 1)
  ends = valid & is_delim
  eos_ids = eos_id_tuple(eos_id)
  if eos_ids:
    is_eos = jnp.zeros(tokens.shape, bool)
    for i in eos_ids:
      is_eos = is_eos | (tokens == i)
    next_is_final_eos = jnp.pad(is_last[:, 1:] & is_eos[:, 1:],
                                ((0, 0), (0, 1)))
    ends = ends & ~next_is_final_eos
  return ends | is_last


def step_ids_from_tokens(tokens: jax.Array,
                         response_mask: jax.Array,
                         delimiter_mask: jax.Array,
                         *,
                         eos_id) -> jax.Array:
  """Index of the step each response token belongs to.

    step_id[b, t] = sum_{t' < t} step_end[b, t']  on valid tokens, else -1.

  Args:
    tokens: int [B, T] token ids.
    response_mask: [B, T] response mask (see `step_ends_from_tokens`).
    delimiter_mask: bool [V] delimiter tokens.
    eos_id: the EOS token id, a sequence of them, or None.

  Returns:
    int32 [B, T]: 0, 1, ... on response tokens, -1 on prompt and padding.
    The number of steps of row b is `max(step_id[b]) + 1` (0 if none).
  """
  ends = step_ends_from_tokens(tokens, response_mask, delimiter_mask,
                               eos_id=eos_id).astype(jnp.int32)
  valid = jnp.asarray(response_mask) > 0
  ids = jnp.cumsum(ends, axis=1) - ends
  return jnp.where(valid, ids, -1).astype(jnp.int32)


def num_steps_from_tokens(tokens: jax.Array,
                          response_mask: jax.Array,
                          delimiter_mask: jax.Array,
                          *,
                          eos_id) -> jax.Array:
  """int32 [B]: the number of steps of every row (0 for empty rows)."""
  ends = step_ends_from_tokens(tokens, response_mask, delimiter_mask,
                               eos_id=eos_id)
  return jnp.sum(ends, axis=1, dtype=jnp.int32)
