"""Refreshing a Q^π verifier on the RL policy's own rollouts (an option).

A PAV's verifier predicts Q^π of each step prefix and V^π of the question
for the policy that produced its Monte-Carlo labels (the SFT policy). As RL
changes π those values drift, and the verifier's advantages with them. Every
sampled response is itself one rollout of the current π from each of its
own prefixes, so its outcome r_b is an unbiased one-sample Monte-Carlo
estimate of Q^π(prefix_{b,k}) for every step k, and of V^π(question):

    targets_{b,k} = r_b  on every step k of response b,   v_target_b = r_b,

trained with the verifier's own soft cross-entropy (`prm.training`, the
loss of its prm stage) in one update per RL step, after the advantages
have read the verifier, so the verifier lags the policy by one step, as
PPO's critic does. The group's n samples of a question average to the MC
estimate of V^π; prefixes shared by several samples, likewise.

`rl.verifier_refresh_lr` > 0 turns it on, for a score-head or generative
verifier trained on soft labels (a PAV's Q^π); the refreshed verifier is a
trained model of the RL stage (`verifier`), checkpointed with its optimizer
state.
"""

import jax
import jax.numpy as jnp

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards.runners import programs

# The heads of the verifiers it can refresh.
HEADS = {"head": ("score",), "generative": ("lm", "score")}


def enabled(config) -> bool:
  return config.rl.verifier_refresh_lr > 0


def check(config, verifier):
  """Raises ConfigError (naming `rl.verifier_refresh_lr`) unless the RL
  stage reads a verifier that predicts Q^π."""
  key = "config.rl.verifier_refresh_lr"
  if verifier is None:
    raise config_lib.ConfigError(
        f"{key}: refreshes the trained verifier, but config.rl.method="
        f"{config.rl.method!r} with prm_source={config.rl.prm_source!r} reads "
        "none.")
  if verifier.model not in HEADS or verifier.target != "soft":
    raise config_lib.ConfigError(
        f"{key}: a rollout's outcome estimates Q^π of its prefixes, which a "
        "score-head or generative verifier trained on soft labels predicts; "
        f"this one is a {verifier.model!r} verifier trained on "
        f"{verifier.target!r} labels.")


def refresh_batch(batch, num_steps: int) -> dict:
  """The verifier's training batch from a rollout batch (jittable).

  Args:
    batch: the RL batch: `tokens`, `attention_mask`, `response_mask`
      (accuracy-filtered rows are all 0 and are left out), `step_ids`
      (clamped to S slots) [B, T]; `rewards` [B].
    num_steps: S.

  Returns:
    The `prm.training.make_prm_step` batch: `tokens`, `attention_mask`,
    `step_ids`; `targets` [B, S] = r_b on every step; `target_mask` [B, S],
    the steps of kept rows; `v_target` [B] = r_b and `v_mask` [B], the kept
    rows.
  """
  kept = (jnp.sum(batch["response_mask"], axis=1) > 0).astype(jnp.float32)
  step_mask = core.step_mask_from_ids(batch["step_ids"], num_steps)
  rewards = batch["rewards"].astype(jnp.float32)
  return {"tokens": batch["tokens"],
          "attention_mask": batch["attention_mask"],
          "step_ids": batch["step_ids"],
          "targets": jnp.broadcast_to(rewards[:, None], step_mask.shape),
          "target_mask": step_mask * kept[:, None],
          "v_target": rewards, "v_mask": kept}


def make(ctx, verifier, tx, shardings):
  """`(state, rollout batch) -> (state, metrics)`: the jitted refresh."""
  step = programs.jit_update(
      programs.prm_step_fn(ctx.config, ctx.model_config, tx,
                           kind=verifier.model,
                           group_size=ctx.config.rl.group_size),
      shardings, ctx.mesh)
  num_steps = ctx.config.task.max_steps
  to_batch = jax.jit(lambda batch: refresh_batch(batch, num_steps))
  keys = ("tokens", "attention_mask", "response_mask", "step_ids", "rewards")

  def refresh(state, batch):
    return step(state, to_batch({k: batch[k] for k in keys}))
  return refresh
