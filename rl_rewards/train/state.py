"""Train state pytree and the guarded gradient application shared by all steps.

A `TrainState` is plain data (a pytree): the step counter, parameters,
optimizer state and the number of updates skipped because the loss or a
gradient was not finite. Step functions are pure
`(state, batch) -> (state, metrics)` and never hold anything else.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array          # int32 scalar: updates applied or skipped so far.
  params: Any
  opt_state: Any
  skipped: jax.Array       # int32 scalar: updates skipped as non-finite.


def create(params, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      opt_state=tx.init(params), skipped=jnp.zeros((), jnp.int32))


def apply_gradients(state: TrainState, grads, loss,
                    tx: optax.GradientTransformation):
  """Applies `grads` unless the loss or the gradient norm is non-finite.

  A non-finite update never reaches the parameters or the optimizer moments:
  the old values are kept (a select between the old and the new values; the
  discarded new ones may hold NaN), `skipped` is incremented, and the step
  still advances (so the data position moves past the bad batch).

  The test is on the global norm ‖g‖ = sqrt(Σ g²), which is NaN or inf
  exactly when some gradient is, or when Σ g² overflows (|g| ≳ 1e19 in
  float32, an update clipping would have zeroed). It is the norm the
  clipping and the metric need anyway, so the guard costs no pass of its
  own over the gradients: on a CPU the AdamW update of the 42 M model took
  136-145 ms against 175-182 ms with a separate finiteness pass and zeroed
  gradients (docs/performance.md).

  Returns:
    The new state and a dict with `grad_norm` (0 on a skipped update) and
    `skipped` (0/1 this step).
  """
  norm = optax.tree.norm(grads)
  finite = jnp.logical_and(jnp.isfinite(norm), jnp.isfinite(loss))
  updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jnp.where(finite, new, old)
  new_state = state.replace(
      step=state.step + 1,
      params=jax.tree.map(keep, new_params, state.params),
      opt_state=jax.tree.map(keep, new_opt_state, state.opt_state),
      skipped=state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32))
  return new_state, {
      "grad_norm": jnp.where(finite, norm, 0.0),
      "skipped": 1.0 - finite.astype(jnp.float32),
  }
