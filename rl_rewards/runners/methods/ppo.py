"""PPO with a learned value model and GAE (Schulman et al., 1707.06347).

  δ_t = r_t + γ V_{t+1} − V_t,  A_t = δ_t + γλ A_{t+1},  A ← masked_whiten(A),
  value targets G_t = A_t + V_t (before whitening),

with the outcome reward on the last response token. The value model starts
from the policy backbone with a fresh score head, has its own optimizer
(`rl.value_learning_rate`) and is regressed (clipped, `rl.value_clip`) on
G_t in every policy minibatch.
"""

import jax
import jax.numpy as jnp

from rl_rewards import core
from rl_rewards import models
from rl_rewards.runners import programs
from rl_rewards.runners.methods import base


def gae(cfg, batch):
  """(whitened advantages [B, T], returns [B, T]) of the outcome reward."""
  mask = batch["response_mask"]
  rewards = core.outcome_token_rewards(batch["rewards"], mask)
  advantages, returns = core.gae(rewards, batch["values"], mask,
                                 gamma=cfg.gae_gamma, lam=cfg.gae_lambda)
  return core.masked_whiten(advantages, mask), returns


class PPO(base.Method):
  """`rl.method="ppo"`: the critic is the extra model `value`."""

  update_keys = ("old_values", "returns")

  def models(self, ctx, params):
    self.value_tx = programs.rl_optimizer(self.cfg, self.cfg.value_learning_rate)
    value_params = models.init_from_backbone(
        ctx.model_config, jax.device_get(params), ctx.rng("value_init"),
        heads=("score",))
    return {"value": base.ExtraModel(value_params, self.value_tx,
                                     ("score",))}

  def build(self, ctx, shardings):
    self.value_step = programs.jit_update(
        programs.value_step_fn(ctx.config, ctx.model_config, self.value_tx),
        shardings["value"], ctx.mesh)
    self.values_fn = programs.values_pass(ctx.config, ctx.model_config)
    self.returns_fn = jax.jit(lambda b: gae(self.cfg, b)[1])

  def planned_programs(self, model_config):
    tx = programs.rl_optimizer(self.cfg, self.cfg.value_learning_rate)
    return (
        programs.PlannedPass("rl/values", ("score",),
                             programs.values_pass(self.config, model_config)),
        programs.PlannedUpdate(
            "rl/value_update", "value", ("score",), tx,
            programs.value_step_fn(self.config, model_config, tx),
            {"old_values": jnp.float32, "returns": jnp.float32}))

  def signals(self, ctx, state, batch):
    values = self.values_fn(state["value"].params, batch["tokens"],
                            batch["attention_mask"])
    returns = self.returns_fn(dict(batch, values=values))
    return state, {"values": values, "old_values": values,
                   "returns": returns}, {}

  def advantages(self, batch):
    a, _ = gae(self.cfg, batch)
    return a, {"outcome": a}

  def update(self, state, minibatch):
    state = dict(state)
    state["value"], metrics = self.value_step(state["value"], minibatch)
    return state, metrics
