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


def all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def apply_gradients(state: TrainState, grads, loss,
                    tx: optax.GradientTransformation):
  """Applies `grads` unless the loss or any gradient is non-finite.

  A non-finite update never reaches the parameters or the optimizer moments:
  the old values are kept, `skipped` is incremented, and the step still
  advances (so the data position moves past the bad batch).

  Returns:
    The new state and a dict with `grad_norm` and `skipped` (0/1 this step).
  """
  finite = jnp.logical_and(all_finite(grads), jnp.isfinite(loss))
  # Zero the gradients before the optimizer sees them, so NaNs cannot leak
  # into its state through arithmetic even on the branch that is discarded.
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
  updates, new_opt_state = tx.update(safe_grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jnp.where(finite, new, old)
  new_state = state.replace(
      step=state.step + 1,
      params=jax.tree.map(keep, new_params, state.params),
      opt_state=jax.tree.map(keep, new_opt_state, state.opt_state),
      skipped=state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32))
  return new_state, {
      "grad_norm": optax.tree.norm(safe_grads),
      "skipped": 1.0 - finite.astype(jnp.float32),
  }
