"""Token <-> step bookkeeping on batch-first arrays.

Data model (shared by the whole package):

* Token arrays are [B, T]. `response_mask[b, t]` is 1 on generated tokens up
  to and including EOS (the last token for a truncated sample), 0 on prompt
  and padding. The valid tokens of a row form one contiguous run.
* `step_ids[b, t]` (int32) is the index of the reasoning step token t belongs
  to, and −1 on prompt and padding tokens. Step k ends at its last token
  e_k (a delimiter, or the last valid token for the final step), so
  step_id(t) = #{k : e_k < t}. Every row with a response token has ≥ 1 step.
* Step arrays are [B, S] with `step_mask[b, k] = k < K_b` (K_b = steps of
  row b). S is a static bound ≥ max_b K_b.

Step values reach tokens by a gather (`steps_to_tokens`), tokens reach steps
by a per-row segment reduction (`tokens_to_steps`); neither loops over time.
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks

_REDUCTIONS = ("sum", "last", "mean")


def _check_token_pair(x, mask, x_name, mask_name, fn):
  _checks.check_rank(x, 2, x_name, fn, "[B, T]")
  _checks.check_same_shape([x, mask], [x_name, mask_name], fn)


def last_valid_index(mask) -> jnp.ndarray:
  """Index of the last valid token of each row, −1 for all-padding rows.

  Args:
    mask: [B, T] validity mask (e.g. response_mask).

  Returns:
    [B] int32, t_b^last = max{t : m_{b,t} = 1}, or −1.
  """
  mask = _checks.as_mask(mask, "mask", "last_valid_index")
  _checks.check_rank(mask, 2, "mask", "last_valid_index", "[B, T]")
  positions = jnp.arange(mask.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(mask, positions, -1), axis=1)


def outcome_token_rewards(scores, response_mask) -> jnp.ndarray:
  """Puts each sample's outcome score on its last valid token.

    R_{b,t} = score_b · 1[t = t_b^last]   (verl's reward placement).

  Args:
    scores: [B] outcome rewards.
    response_mask: [B, T] response mask.

  Returns:
    [B, T] token rewards; all-padding rows are all 0.
  """
  fn = "outcome_token_rewards"
  scores = _checks.as_float(scores, "scores", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_rank(scores, 1, "scores", fn, "[B]")
  _checks.check_rank(mask, 2, "response_mask", fn, "[B, T]")
  _checks.check_batch(mask, scores.shape[0], "response_mask", fn)
  last = last_valid_index(mask)
  is_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  return jnp.where(is_last, scores[:, None], 0)


def broadcast_to_tokens(values, response_mask) -> jnp.ndarray:
  """Gives every valid token its sample's value: A_{b,t} = v_b · m_{b,t}.

  Args:
    values: [B] per-sample values (e.g. group advantages).
    response_mask: [B, T] response mask.

  Returns:
    [B, T], 0 on invalid tokens.
  """
  fn = "broadcast_to_tokens"
  values = _checks.as_float(values, "values", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _checks.check_rank(values, 1, "values", fn, "[B]")
  _checks.check_rank(mask, 2, "response_mask", fn, "[B, T]")
  _checks.check_batch(mask, values.shape[0], "response_mask", fn)
  return jnp.where(mask, values[:, None], 0)


def step_ids_from_step_ends(step_end_mask, response_mask) -> jnp.ndarray:
  """Step index of every token from step-end (delimiter) flags.

    e = step_end ∧ m, plus the last valid token;   id_t = Σ_{u<t} e_u on
    valid tokens, −1 elsewhere.

  The last valid token always closes a step, so a response without any
  delimiter is one step, and a truncated response still ends its final step.
  Step ends outside the response are ignored. Consecutive delimiters give
  steps made of just the delimiter token ("empty" steps keep their place).

  Args:
    step_end_mask: [B, T] 1 on the last token of each step (e.g. a newline).
    response_mask: [B, T] response mask.

  Returns:
    [B, T] int32 step ids, −1 on prompt and padding.
  """
  fn = "step_ids_from_step_ends"
  ends = _checks.as_mask(step_end_mask, "step_end_mask", fn)
  mask = _checks.as_mask(response_mask, "response_mask", fn)
  _check_token_pair(ends, mask, "step_end_mask", "response_mask", fn)
  last = last_valid_index(mask)
  is_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  ends = (ends & mask) | is_last
  ends_before = jnp.cumsum(ends, axis=1, dtype=jnp.int32) - ends
  return jnp.where(mask, ends_before, -1).astype(jnp.int32)


def step_end_mask_from_ids(step_ids) -> jnp.ndarray:
  """Flags the last token of every step: step_ids[t] ≥ 0 and id changes next.

  Args:
    step_ids: [B, T] int step ids, −1 on prompt/padding.

  Returns:
    [B, T] bool, True on the step-end tokens e_k (the final one included).
  """
  fn = "step_end_mask_from_ids"
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(ids, 2, "step_ids", fn, "[B, T]")
  following = jnp.concatenate(
      [ids[:, 1:], jnp.full((ids.shape[0], 1), -1, ids.dtype)], axis=1)
  return (ids >= 0) & (following != ids)


def num_steps_per_row(step_ids) -> jnp.ndarray:
  """K_b = max_t step_ids[b, t] + 1 ([B] int32; 0 for rows without steps)."""
  ids = _checks.as_int(step_ids, "step_ids", "num_steps_per_row")
  _checks.check_rank(ids, 2, "step_ids", "num_steps_per_row", "[B, T]")
  return jnp.max(ids, axis=1, initial=-1) + 1


def step_mask_from_ids(step_ids, num_steps: int) -> jnp.ndarray:
  """[B, S] step mask, True for k < K_b. Requires num_steps ≥ max K_b."""
  fn = "step_mask_from_ids"
  _check_num_steps(num_steps, fn)
  counts = num_steps_per_row(step_ids)
  return jnp.arange(num_steps)[None, :] < counts[:, None]


def _check_num_steps(num_steps, fn):
  if not isinstance(num_steps, int) or isinstance(num_steps, bool) or (
      num_steps < 1):
    raise ValueError(
        f"{fn}: `num_steps` must be a positive Python int (static), got "
        f"{num_steps!r}.")


def steps_to_tokens(step_values, step_ids) -> jnp.ndarray:
  """Gives every token the value of the step it belongs to.

    x_{b,t} = v_{b, id(b,t)},  and 0 where id = −1 (or id ≥ S).

  Args:
    step_values: [B, S] per-step values.
    step_ids: [B, T] int step ids, −1 on prompt/padding.

  Returns:
    [B, T] token values.
  """
  fn = "steps_to_tokens"
  values = _checks.as_float(step_values, "step_values", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _checks.check_rank(values, 2, "step_values", fn, "[B, S]")
  _checks.check_rank(ids, 2, "step_ids", fn, "[B, T]")
  _checks.check_batch(ids, values.shape[0], "step_ids", fn)
  num_steps = values.shape[1]
  valid = (ids >= 0) & (ids < num_steps)
  gathered = jnp.take_along_axis(
      values, jnp.clip(ids, 0, num_steps - 1), axis=1)
  return jnp.where(valid, gathered, 0)


def steps_to_end_tokens(step_values, step_ids) -> jnp.ndarray:
  """Puts each step's value on its step-end token only (0 elsewhere).

    R_{b,t} = Σ_k v_{b,k}·1[t = e_{b,k}]  — how process rewards enter a
    token-level reward tensor (PURE, GRPO with process supervision).

  Args:
    step_values: [B, S] per-step values.
    step_ids: [B, T] int step ids.

  Returns:
    [B, T] token values.
  """
  ends = step_end_mask_from_ids(step_ids)
  return jnp.where(ends, steps_to_tokens(step_values, step_ids), 0)


def tokens_to_steps(token_values, step_ids, num_steps: int,
                    reduce: str = "sum") -> jnp.ndarray:
  """Reduces token values over the tokens of each step.

    sum:  v_k = Σ_{t: id=k} x_t;   last: v_k = x_{e_k};
    mean: v_k = (Σ_{t: id=k} x_t) / #{t: id=k}  (0 for steps without tokens).

  Tokens with id −1 are ignored; steps k ≥ K_b get 0.

  Args:
    token_values: [B, T] token values.
    step_ids: [B, T] int step ids, −1 on prompt/padding.
    num_steps: static S, the size of the step axis.
    reduce: 'sum' (default), 'last' or 'mean'.

  Returns:
    [B, S] step values.
  """
  fn = "tokens_to_steps"
  _checks.check_choice(reduce, _REDUCTIONS, "reduce", fn)
  _check_num_steps(num_steps, fn)
  values = _checks.as_float(token_values, "token_values", fn)
  ids = _checks.as_int(step_ids, "step_ids", fn)
  _check_token_pair(values, ids, "token_values", "step_ids", fn)
  if reduce == "last":
    values = jnp.where(step_end_mask_from_ids(ids), values, 0)
  sums = _segment_sum_rows(values, ids, num_steps)
  if reduce != "mean":
    return sums
  counts = _segment_sum_rows(jnp.ones_like(values), ids, num_steps)
  return jnp.where(counts > 0, sums / jnp.maximum(counts, 1), 0)


def step_token_counts(step_ids, num_steps: int) -> jnp.ndarray:
  """Number of tokens in each step, [B, S] float32 (delimiter included)."""
  ids = _checks.as_int(step_ids, "step_ids", "step_token_counts")
  _check_num_steps(num_steps, "step_token_counts")
  return _segment_sum_rows(jnp.ones(ids.shape, jnp.float32), ids, num_steps)


def _segment_sum_rows(values, ids, num_steps):
  """Per-row segment sum; ids outside [0, S) go to a dropped extra bucket."""
  ids = jnp.where((ids >= 0) & (ids < num_steps), ids, num_steps)

  def row(v, i):
    return jax.ops.segment_sum(v, i, num_segments=num_steps + 1)

  return jax.vmap(row)(values, ids)[:, :num_steps]
