"""Optimizer factory: config section -> optax.GradientTransformation."""

import optax


def make_optimizer(*, learning_rate: float, warmup_steps: int = 0,
                   weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-8,
                   grad_clip: float = 0.0) -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping and a linear warm-up.

  The learning rate ramps linearly from 0 to `learning_rate` over
  `warmup_steps` updates, then stays constant.

  Args:
    learning_rate: peak learning rate (> 0).
    warmup_steps: linear warm-up length (0: none).
    weight_decay: decoupled weight decay coefficient.
    b1: Adam first-moment decay.
    b2: Adam second-moment decay.
    eps: Adam epsilon.
    grad_clip: clip gradients to this global norm (0: no clipping).

  Returns:
    The optax transformation.
  """
  if learning_rate <= 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}.")
  if warmup_steps > 0:
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup_steps),
         optax.constant_schedule(learning_rate)], [warmup_steps])
  else:
    schedule = optax.constant_schedule(learning_rate)
  parts = []
  if grad_clip > 0:
    parts.append(optax.clip_by_global_norm(grad_clip))
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps,
                           weight_decay=weight_decay))
  return optax.chain(*parts)
