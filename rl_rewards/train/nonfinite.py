"""Non-finite updates: injecting them (to test the guard) and stopping on runs.

`state.apply_gradients` skips an update whose loss or gradient is not finite
and counts it. Two pieces around that guard live here:

* `fault_fn(entries)`: the `fault` argument of the update-step factories
  (`steps.make_update_step`). Inside the jitted step it replaces the loss,
  or one gradient element, by NaN or ±Inf on the chosen updates, selected by
  the state's step counter, so every step type can be hit through the
  config (`debug.nonfinite_steps`, parsed by `config_lib.nonfinite_steps`).
  On other updates it selects the original values: the update is bit for
  bit the one without injection.
* `SkipGuard`: the host-side count of consecutive skipped updates of one
  model; `train.max_consecutive_skips` in a row raise `NonFiniteError`
  naming the stage and step (a run whose every update is skipped has
  diverged: it should stop, not burn its budget).
"""

import jax
import jax.numpy as jnp
import numpy as np

_VALUES = {"nan": float("nan"), "inf": float("inf")}


def fault_fn(entries):
  """`(step, loss, grads) -> (loss, grads)` injecting non-finite values.

  Args:
    entries: `[(first, last, mode), ...]`: updates `first..last` (the step
      counter after the update, 1-based) get `mode`, one of `grad_nan`,
      `grad_inf` (the first element of the first gradient leaf), `loss_nan`,
      `loss_inf` (the loss). Empty or None: no injection (returns None).
  """
  if not entries:
    return None
  entries = tuple(entries)

  def fault(step, loss, grads):
    for first, last, mode in entries:
      hit = (step >= first) & (step <= last)
      target, kind = mode.split("_")
      bad = _VALUES[kind]
      if target == "loss":
        loss = jnp.where(hit, jnp.asarray(bad, loss.dtype), loss)
      else:
        leaves, treedef = jax.tree.flatten(grads)
        flat = leaves[0].reshape(-1)
        flat = flat.at[0].set(jnp.where(hit, jnp.asarray(bad, flat.dtype),
                                        flat[0]))
        leaves[0] = flat.reshape(leaves[0].shape)
        grads = jax.tree.unflatten(treedef, leaves)
    return loss, grads

  return fault


class NonFiniteError(RuntimeError):
  """Too many consecutive updates had a non-finite loss or gradient."""


class SkipGuard:
  """Counts consecutive skipped updates of one model; raises past a limit.

  `observe(step, skipped)` takes the update's `skipped` metric (0/1, a device
  scalar is fine) and reads it one update late, so checking never makes the
  host wait for the device; `flush()` reads the last one (call it before
  saving `run` in a checkpoint). `run` is the current streak: store it in
  the checkpoint meta and pass it back on resume, so a resumed run stops at
  the same step as an uninterrupted one.
  """

  def __init__(self, stage: str, limit: int, run: int = 0,
               what: str = "update"):
    self.stage, self.limit, self.run, self.what = stage, limit, run, what
    self._pending = None

  def observe(self, step: int, skipped):
    previous, self._pending = self._pending, (int(step), skipped)
    if previous is not None:
      self._check(*previous)

  def flush(self) -> int:
    if self._pending is not None:
      pending, self._pending = self._pending, None
      self._check(*pending)
    return self.run

  def _check(self, step, skipped):
    self.run = self.run + 1 if float(np.asarray(skipped)) > 0 else 0
    if self.limit and self.run >= self.limit:
      raise NonFiniteError(
          f"[{self.stage}] {self.run} consecutive {self.what}s had a "
          f"non-finite loss or gradient and were skipped (steps "
          f"{step - self.run + 1}..{step}); stopping at {self.stage} step "
          f"{step} (config.train.max_consecutive_skips={self.limit}).")
