"""Guarded gradient application: non-finite updates never reach the params."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_rewards.train import optim
from rl_rewards.train import state as state_lib


def _state():
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  tx = optim.make_optimizer(learning_rate=0.1, grad_clip=1.0)
  return state_lib.create(params, tx), tx


def test_finite_update_changes_params():
  state, tx = _state()
  grads = jax.tree.map(jnp.ones_like, state.params)
  new, metrics = jax.jit(
      lambda s, g: state_lib.apply_gradients(s, g, jnp.float32(1.0), tx))(
          state, grads)
  assert int(new.step) == 1 and int(new.skipped) == 0
  assert float(metrics["skipped"]) == 0.0
  assert not np.allclose(new.params["w"], state.params["w"])


def test_nan_gradient_is_skipped_and_counted():
  state, tx = _state()
  grads = jax.tree.map(jnp.ones_like, state.params)
  grads["b"] = grads["b"].at[1].set(jnp.nan)
  new, metrics = state_lib.apply_gradients(state, grads, jnp.float32(1.0), tx)
  assert int(new.step) == 1 and int(new.skipped) == 1
  assert float(metrics["skipped"]) == 1.0
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(new.opt_state),
                  jax.tree.leaves(state.opt_state)):
    np.testing.assert_array_equal(a, b)
  # A later finite step works normally from the untouched state.
  good = jax.tree.map(jnp.ones_like, state.params)
  newer, _ = state_lib.apply_gradients(new, good, jnp.float32(1.0), tx)
  assert int(newer.skipped) == 1 and int(newer.step) == 2
  assert np.all(np.isfinite(newer.params["b"]))


def test_finite_update_is_the_optimizers_own():
  """On finite gradients the guarded update is optax's (to float rounding:
  ours is jitted, the reference eager)."""
  state, tx = _state()
  grads = {"w": jnp.full((2, 3), 0.3), "b": jnp.array([0.5, -2.0, 1.0])}
  new, metrics = jax.jit(
      lambda s, g: state_lib.apply_gradients(s, g, jnp.float32(1.0), tx))(
          state, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  expected = optax.apply_updates(state.params, updates)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
  for a, b in zip(jax.tree.leaves(new.opt_state), jax.tree.leaves(opt_state)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
  norm = np.sqrt(6 * 0.3 ** 2 + 0.25 + 4.0 + 1.0)
  np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-6)


def test_infinite_or_overflowing_gradients_are_skipped():
  """+inf, -inf, and a finite gradient whose squared norm overflows
  float32 (|g| = 1e20) are skipped like NaN, with grad_norm 0."""
  for bad in (jnp.inf, -jnp.inf, 1e20):
    state, tx = _state()
    grads = jax.tree.map(jnp.ones_like, state.params)
    grads["w"] = grads["w"].at[0, 2].set(bad)
    new, metrics = jax.jit(
        lambda s, g: state_lib.apply_gradients(s, g, jnp.float32(1.0), tx))(
            state, grads)
    assert int(new.skipped) == 1 and float(metrics["skipped"]) == 1.0, bad
    assert float(metrics["grad_norm"]) == 0.0
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state)):
      if a.shape:  # Every parameter and moment, untouched.
        np.testing.assert_array_equal(a, b)


def test_infinite_loss_is_skipped():
  state, tx = _state()
  grads = jax.tree.map(jnp.ones_like, state.params)
  new, _ = state_lib.apply_gradients(state, grads, jnp.float32(jnp.inf), tx)
  assert int(new.skipped) == 1
  np.testing.assert_array_equal(new.params["w"], state.params["w"])


def test_warmup_schedule():
  tx = optim.make_optimizer(learning_rate=1.0, warmup_steps=4, b2=0.99)
  params = {"x": jnp.zeros(())}
  opt = tx.init(params)
  updates = []
  for _ in range(6):
    u, opt = tx.update({"x": jnp.ones(())}, opt, params)
    updates.append(-float(u["x"]))
  # Adam's normalised step is ~1, scaled by lr = step/4 during warm-up.
  np.testing.assert_allclose(updates, [0, .25, .5, .75, 1, 1], atol=1e-3)
  assert isinstance(tx, optax.GradientTransformation)
