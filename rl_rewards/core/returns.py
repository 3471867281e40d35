"""Returns over tokens and steps: discounted sums, GAE and min-form returns.

Token-level recurrences run right to left over a [B, T] array, with no
bootstrap after the last valid token. What an invalid token inside a row (a
hole, e.g. masked tool output) does to the running value follows the
reference of each method:

* `gae` and `reward_to_go` carry it through holes (verl's GAE loop; the
  reverse cumsum of PRIME and PURE);
* `discounted_returns` resets it at every invalid token (verl's REINFORCE++
  loop, `running_return *= mask[:, t]`), so each run of valid tokens is an
  episode of its own.

On the data model (docs/data_model.md: prompt zeros, response ones, padding
zeros) there are no holes and the two conventions agree.

Two equivalent implementations are chosen at run time with `lax.cond`:

* Rows whose valid tokens form one contiguous run (the data model: prompt
  zeros, response ones, padding zeros) use a chunked closed form. Inside a
  row the recurrence y_t = x_t + d·y_{t+1} is then a constant-coefficient
  discounted sum, y = P·x with P_{ts} = d^{s−t} (s ≥ t). T is cut into chunks
  of C tokens; a [C, C] Toeplitz matmul gives each chunk's local sums, a
  second [N, N] matmul over the N = T/C chunk starts carries sums across
  chunks, and y_t = local_t + d^{C−t mod C}·Y_{next chunk}. Everything is
  matmuls and elementwise passes: no loop over time.
* Anything else (holes inside a row) falls back to a
  `lax.scan(reverse=True)` over time with the reference loop's semantics.
  (`reward_to_go` needs no fallback: with γ = 1 and zero rewards on holes,
  carrying through a hole is the plain closed form.)
"""

import jax
import jax.numpy as jnp

from rl_rewards.core import _checks

_HIGHEST = jax.lax.Precision.HIGHEST
_MIN_FORMS = ("running_min", "paper")


def _prepare_tokens(rewards, mask, fn, values=None):
  rewards = _checks.as_float(rewards, "rewards", fn)
  mask = _checks.as_mask(mask, "mask", fn)
  _checks.check_rank(rewards, 2, "rewards", fn, "[B, T]")
  arrays, names = [rewards, mask], ["rewards", "mask"]
  if values is not None:
    values = _checks.as_float(values, "values", fn)
    arrays.append(values)
    names.append("values")
  _checks.check_same_shape(arrays, names, fn)
  return rewards, mask, values


def rows_are_contiguous(mask) -> jnp.ndarray:
  """True iff every row's valid entries form at most one contiguous run."""
  mask = jnp.asarray(mask, bool)
  starts = mask & ~jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))
  return jnp.all(jnp.sum(starts, axis=1) <= 1)


def _chunk_size(length: int) -> int:
  """Power-of-two chunk C ≈ sqrt(T)/2, clamped to [8, 128]."""
  c = 8
  while c < 128 and (2 * c) ** 2 <= length:
    c *= 2
  return c


def _powers(discount, size, dtype):
  """[size, size] upper-triangular P_{ts} = d^{s−t} (s ≥ t), tiny → 0."""
  idx = jnp.arange(size)
  exponent = idx[None, :] - idx[:, None]
  p = jnp.power(jnp.asarray(discount, dtype),
                jnp.maximum(exponent, 0).astype(dtype))
  # Flush values that would be denormal; they are slow on CPUs.
  return jnp.where((exponent >= 0) & (p > 1e-30), p, 0).astype(dtype)


def _discounted_sum_contiguous(x, discount):
  """y_t = Σ_{s≥t} d^{s−t} x_s along axis 1 by chunked Toeplitz matmuls."""
  batch, length = x.shape
  chunk = _chunk_size(length)
  num_chunks = -(-length // chunk)
  padded = num_chunks * chunk
  x = jnp.pad(x, ((0, 0), (0, padded - length)))
  x3 = x.reshape(batch, num_chunks, chunk)
  local = jnp.einsum("bns,ts->bnt", x3, _powers(discount, chunk, x.dtype),
                     precision=_HIGHEST)
  decay = jnp.asarray(discount, x.dtype) ** chunk
  starts = jnp.einsum("bm,nm->bn", local[:, :, 0],
                      _powers(decay, num_chunks, x.dtype), precision=_HIGHEST)
  carry_in = jnp.pad(starts[:, 1:], ((0, 0), (0, 1)))
  tail = jnp.power(jnp.asarray(discount, x.dtype),
                   (chunk - jnp.arange(chunk)).astype(x.dtype))
  y = local + tail[None, None, :] * carry_in[:, :, None]
  return y.reshape(batch, padded)[:, :length]


def _masked_recurrence_scan(x, mask, discount):
  """Carry through holes: y_t = x_t + d·y_{t+1} on valid t, y_{t+1} else."""

  def step(carry, inputs):
    x_t, m_t = inputs
    y = jnp.where(m_t, x_t + discount * carry, carry)
    return y, y

  _, y = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), (x.T, mask.T),
                      reverse=True)
  return y.T


def _reset_recurrence_scan(x, mask, discount):
  """Reset at holes (verl REINFORCE++): y_t = x_t + d·y_{t+1} on valid t,
  where y_{t+1} = 0 when t + 1 is invalid or t = T − 1."""

  def step(carry, inputs):
    x_t, m_t = inputs
    y = jnp.where(m_t, x_t + discount * carry, 0)
    return y, y

  _, y = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), (x.T, mask.T),
                      reverse=True)
  return y.T


def discounted_returns(rewards, mask, *, gamma=1.0) -> jnp.ndarray:
  """REINFORCE++'s discounted reward-to-go, reset at every invalid token.

    G_t = r_t + γ·G_{t+1}  for valid t,   G_{t+1} := 0 if t + 1 is invalid
    (or t = T − 1);   G_t = 0 for invalid t.

  This is verl's `compute_reinforce_plus_plus_outcome_advantage` loop
  (`running_return = r_t + γ·running_return; running_return *= mask[:, t]`):
  an invalid token inside a row (a hole) ends the return of the tokens
  before it, so a reward after the hole does not reach them. Rewards on
  invalid tokens are ignored. For rows whose valid tokens are one contiguous
  run (every row of the data model) this is G_t = Σ_{s≥t} γ^{s−t}·r_s over
  the run. For PRIME/PURE's reverse cumsum across holes, see `reward_to_go`.

  Args:
    rewards: [B, T] token rewards (outcome on the last token, −β·KL, ...).
    mask: [B, T] response mask.
    gamma: discount γ (scalar, may be traced).

  Returns:
    [B, T] returns, 0 on invalid tokens.
  """
  rewards, mask, _ = _prepare_tokens(rewards, mask, "discounted_returns")
  gamma = jnp.asarray(gamma, rewards.dtype)

  def contiguous(rewards, mask):
    # One run per row: nothing valid follows the run, so resetting after it
    # changes nothing and the closed form over the masked rewards is exact.
    x = jnp.where(mask, rewards, 0)
    return jnp.where(mask, _discounted_sum_contiguous(x, gamma), 0)

  def general(rewards, mask):
    x = jnp.where(mask, rewards, 0)
    return jnp.where(mask, _reset_recurrence_scan(x, mask, gamma), 0)

  # Masking happens inside the branches so that it fuses with their work.
  return jax.lax.cond(rows_are_contiguous(mask), contiguous, general,
                      rewards, mask)


def reward_to_go(rewards, mask) -> jnp.ndarray:
  """Undiscounted reward-to-go carried across holes (reverse cumsum).

    G_t = Σ_{s≥t} r_s·m_s   for valid t;   0 for invalid t.

  PRIME's and PURE's return (γ = 1): `(R·m).flip(−1).cumsum(−1).flip(−1)`.
  Unlike `discounted_returns`, a hole does not cut the sum: rewards after it
  still reach the tokens before it. The two agree on rows whose valid tokens
  are one contiguous run.

  Args:
    rewards: [B, T] token rewards.
    mask: [B, T] response mask.

  Returns:
    [B, T] returns, 0 on invalid tokens.
  """
  rewards, mask, _ = _prepare_tokens(rewards, mask, "reward_to_go")
  x = jnp.where(mask, rewards, 0)
  # γ = 1: the closed form needs no contiguity (holes hold 0).
  return jnp.where(mask, _discounted_sum_contiguous(
      x, jnp.asarray(1.0, x.dtype)), 0)


def _gae_scan(rewards, values, mask, gamma, lam):
  """verl's loop: δ_t = r_t + γ·V_next − V_t; V_next, A_next skip masks."""

  def step(carry, inputs):
    next_value, next_adv = carry
    r_t, v_t, m_t = inputs
    adv = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    next_value = jnp.where(m_t, v_t, next_value)
    next_adv = jnp.where(m_t, adv, next_adv)
    return (next_value, next_adv), next_adv

  zeros = jnp.zeros_like(rewards[:, 0])
  _, adv = jax.lax.scan(step, (zeros, zeros),
                        (rewards.T, values.T, mask.T), reverse=True)
  return adv.T


def _gae_contiguous(rewards, values, mask, gamma, lam):
  masked_values = jnp.where(mask, values, 0)
  next_values = jnp.pad(masked_values[:, 1:], ((0, 0), (0, 1)))
  deltas = jnp.where(mask, rewards + gamma * next_values - values, 0)
  return _discounted_sum_contiguous(deltas, gamma * lam)


def gae(rewards, values, mask, *, gamma, lam):
  """Generalised advantage estimation over tokens (verl semantics).

    δ_t = r_t + γ·V_{t'} − V_t,   A_t = δ_t + γλ·A_{t'},   G_t = A_t + V_t,

  where t' is the next valid token after t, and V_{t'} = A_{t'} = 0 after the
  last valid token: values past the end of a response are ignored (bootstrap
  0), so a truncated response is treated as terminal, as in verl.

  Raw, not whitened: whiten with `masked_whiten(advantages, mask)` as verl's
  `compute_gae_advantage_return` does. Invalid tokens get 0 in both outputs
  (verl leaves garbage there: carried A and A + V).

  Args:
    rewards: [B, T] token rewards.
    values: [B, T] value estimates V_t.
    mask: [B, T] response mask.
    gamma: discount γ (scalar, may be traced).
    lam: GAE λ (scalar, may be traced).

  Returns:
    (advantages [B, T], returns [B, T]).
  """
  rewards, mask, values = _prepare_tokens(rewards, mask, "gae", values)
  gamma = jnp.asarray(gamma, rewards.dtype)
  lam = jnp.asarray(lam, rewards.dtype)

  def branch(advantage_fn):
    def fn(rewards, values, mask):
      rewards = jnp.where(mask, rewards, 0)
      values = jnp.where(mask, values, 0)
      adv = jnp.where(mask, advantage_fn(rewards, values, mask, gamma, lam),
                      0)
      return adv, jnp.where(mask, adv + values, 0)
    return fn

  # Masking happens inside the branches so that it fuses with their work.
  return jax.lax.cond(rows_are_contiguous(mask), branch(_gae_contiguous),
                      branch(_gae_scan), rewards, values, mask)


def _prepare_steps(step_rewards, step_mask, fn):
  rewards = _checks.as_float(step_rewards, "step_rewards", fn)
  mask = _checks.as_mask(step_mask, "step_mask", fn)
  _checks.check_rank(rewards, 2, "step_rewards", fn, "[B, S]")
  _checks.check_same_shape([rewards, mask], ["step_rewards", "step_mask"], fn)
  return rewards, mask


def step_returns(step_rewards, step_mask, *, gamma=1.0) -> jnp.ndarray:
  """Sum-form step returns G_k = Σ_{j≥k, valid} γ^{#valid in [k, j)} r_j.

  Args:
    step_rewards: [B, S] step rewards.
    step_mask: [B, S] step mask.
    gamma: discount per step.

  Returns:
    [B, S] returns, 0 on invalid steps.
  """
  rewards, mask = _prepare_steps(step_rewards, step_mask, "step_returns")
  x = jnp.where(mask, rewards, 0)
  y = _masked_recurrence_scan(x, mask, jnp.asarray(gamma, x.dtype))
  return jnp.where(mask, y, 0)


def min_form_returns(step_rewards, step_mask, *,
                     form: str = "running_min") -> jnp.ndarray:
  """Min-form credit assignment (PURE): the return is a minimum, not a sum.

    running_min (default):  G_k = min_{j ≥ k, valid} r_j.
    paper:                  G_k = min_{j ≥ k} r_j if k ≤ w else 0, with
                            w = the first argmin of the valid r (PURE §3.1).

  Ties: 'paper' zeros everything after the *first* minimum. Invalid steps
  and rows without valid steps give 0.

  Args:
    step_rewards: [B, S] step rewards r_k (e.g. PRM scores in [−1, 1]).
    step_mask: [B, S] step mask.
    form: 'running_min' or 'paper'.

  Returns:
    [B, S] min-form returns.
  """
  fn = "min_form_returns"
  _checks.check_choice(form, _MIN_FORMS, "form", fn)
  rewards, mask = _prepare_steps(step_rewards, step_mask, fn)
  filled = jnp.where(mask, rewards, jnp.inf)
  running = jax.lax.cummin(filled, axis=1, reverse=True)
  keep = mask
  if form == "paper":
    first_argmin = jnp.argmin(filled, axis=1)
    keep = keep & (jnp.arange(rewards.shape[1])[None, :]
                   <= first_argmin[:, None])
  return jnp.where(keep, running, 0)


def token_min_form_returns(token_rewards, mask) -> jnp.ndarray:
  """PURE's token-level "strict min-form" (its verl branch), verbatim.

    G_t = min(R_t·m_t, G_{t+1}) right to left over all positions, G_T = +∞,

  then masked. Non-step tokens hold 0, so this is min(0, future step
  rewards): a quirk of the reference code, kept for comparison. Prefer
  `min_form_returns` on step arrays.

  Args:
    token_rewards: [B, T] rewards on step-end tokens, 0 elsewhere.
    mask: [B, T] response mask.

  Returns:
    [B, T] returns, 0 on invalid tokens.
  """
  rewards, mask, _ = _prepare_tokens(token_rewards, mask,
                                     "token_min_form_returns")
  x = jnp.where(mask, rewards, 0)
  batch, length = x.shape
  chunk = 8
  num_chunks = -(-length // chunk)
  x = jnp.pad(x, ((0, 0), (0, num_chunks * chunk - length)),
              constant_values=jnp.inf)
  local = jax.lax.cummin(x.reshape(batch, num_chunks, chunk), axis=2,
                         reverse=True)
  starts = jax.lax.cummin(local[:, :, 0], axis=1, reverse=True)
  carry_in = jnp.pad(starts[:, 1:], ((0, 0), (0, 1)), constant_values=jnp.inf)
  y = jnp.minimum(local, carry_in[:, :, None]).reshape(batch, -1)[:, :length]
  return jnp.where(mask, y, 0)
