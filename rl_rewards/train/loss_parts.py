"""Losses as sums of micro-batch parts over whole-batch normalisers.

A mean over a minibatch is not the mean of its micro-batch means: with
micro-batches of unequal token counts, Σ_j mean_j / n ≠ Σ ℓ·m / Σ m. So an
accumulable loss is split in two:

  normalizers(batch) -> norms      counts of the whole minibatch (no params)
  part(params, micro, norms)       this micro-batch's share of the loss

with loss(batch) = Σ_j part(micro_j, norms) exactly (up to float rounding),
for every loss and metric. For a single micro-batch (no accumulation) the
parts below compute the same floating-point operations as `core`'s
reductions (`masked_mean`, `aggregate_loss`), so results do not change.

The aggregation modes (`core.aggregate_loss`), with ℓ [B, T], m [B, T]:

  token-mean:              Σ ℓ·m / N_tok,     N_tok = Σ m
  seq-mean-token-sum:      Σ_b (Σ_t ℓ·m) / N_seq,
  seq-mean-token-mean:     Σ_b (Σ_t ℓ·m / max(Σ_t m, 1)) / N_seq,
                           N_seq = #{b : Σ_t m_b > 0}
  seq-mean-token-sum-norm: Σ ℓ·m / scale   (a constant; default T)

N_tok and N_seq are counted on the whole minibatch by `aggregate_normalizers`.
"""

import jax.numpy as jnp

from rl_rewards import core


def safe_divide(numerator, denominator):
  """numerator / denominator, and 0 where the denominator is 0 (as
  `core.masked_mean` does for an empty selection)."""
  safe = jnp.where(denominator > 0, denominator, 1)
  return jnp.where(denominator > 0, numerator / safe, 0)


def masked_mean_part(x, mask, count):
  """Σ x·m / count: a micro-batch's share of a masked mean over `count`
  valid entries of the whole batch (`core.masked_mean` when one part)."""
  return safe_divide(core.masked_sum(x, mask), count)


def aggregate_normalizers(mask):
  """Whole-batch counts of every aggregation mode.

  Args:
    mask: [B, T] loss mask of the whole minibatch.

  Returns:
    dict: `tokens` = Σ m, `rows` = #{b : Σ_t m_b > 0} (float32 scalars).
  """
  mask = jnp.asarray(mask)
  mask = mask if mask.dtype == jnp.bool_ else mask != 0
  counts = jnp.sum(mask, axis=1, dtype=jnp.float32)
  return {"tokens": core.masked_count(mask),
          "rows": jnp.sum(counts > 0, dtype=jnp.float32)}


def aggregate_part(loss, mask, norms, *, mode: str = "token-mean",
                   scale=None):
  """A micro-batch's share of `core.aggregate_loss(loss, mask, mode=mode)`.

  Args:
    loss: [b, T] token losses of the micro-batch.
    mask: [b, T] its loss mask.
    norms: `aggregate_normalizers` of the whole minibatch.
    mode: one of `core.LOSS_AGG_MODES`.
    scale: constant of 'seq-mean-token-sum-norm' (default T).

  Returns:
    Scalar; the parts of all micro-batches sum to the minibatch's loss.
  """
  if mode not in core.LOSS_AGG_MODES:
    raise ValueError(f"mode must be one of {core.LOSS_AGG_MODES}, got "
                     f"{mode!r}.")
  loss = jnp.asarray(loss, jnp.promote_types(jnp.asarray(loss).dtype,
                                             jnp.float32))
  mask = jnp.asarray(mask)
  mask = mask if mask.dtype == jnp.bool_ else mask != 0
  if mode == "token-mean":
    return masked_mean_part(loss, mask, norms["tokens"])
  row_sums = jnp.sum(jnp.where(mask, loss, 0), axis=1)
  if mode == "seq-mean-token-sum-norm":
    total = core.masked_sum(row_sums, True)
    return total / (loss.shape[1] if scale is None else scale)
  counts = jnp.sum(mask, axis=1, dtype=loss.dtype)
  if mode == "seq-mean-token-mean":
    row_sums = row_sums / jnp.maximum(counts, 1)
  return masked_mean_part(row_sums, counts > 0, norms["rows"])


def present_rows(mask):
  """[B] bool: rows of a [B, T] mask with at least one valid token."""
  mask = jnp.asarray(mask)
  return jnp.any(mask if mask.dtype == jnp.bool_ else mask != 0, axis=1)


def implicit_prm_normalizers(mask, group_size: int):
  """Whole-batch counts of the implicit-PRM losses (`core.implicit_prm_*`).

  Args:
    mask: [B, T] response mask of the whole batch; all-zero rows are absent.
    group_size: n, rows per group (contiguous).

  Returns:
    dict: `rows` = #{b : Σ_t m_b > 0}, `groups` = #{groups with such a
    row} (float32 scalars).
  """
  present = present_rows(mask)
  if group_size < 1 or present.shape[0] % group_size:
    raise ValueError(f"implicit_prm_normalizers: group_size {group_size} "
                     f"does not divide the batch of {present.shape[0]} rows.")
  groups = jnp.any(present.reshape(-1, group_size), axis=1)
  return {"rows": jnp.sum(present, dtype=jnp.float32),
          "groups": jnp.sum(groups, dtype=jnp.float32)}


def row_fraction(rows: int, norms):
  """b / B for a micro-batch of b rows of a B-row batch (norms["batch_rows"]):
  scales a micro-batch's row mean into its share of the batch's row mean
  (exactly 1 when b = B)."""
  return jnp.float32(rows) / norms["batch_rows"]
