"""PPO with a learned value model and GAE (Schulman et al., 1707.06347).

  δ_t = r_t + γ V_{t+1} − V_t,  A_t = δ_t + γλ A_{t+1},  A ← masked_whiten(A),
  value targets G_t = A_t + V_t (before whitening),

with the outcome reward on the last response token. The value model starts
from the policy backbone with a fresh score head, has its own optimizer
(`rl.ppo.value_learning_rate`) and is regressed (clipped,
`rl.ppo.value_clip`) on G_t in every policy minibatch; γ = `rl.gae_gamma`,
λ = `rl.ppo.gae_lambda`.
"""

import functools

import jax
import jax.numpy as jnp

from rl_rewards import core
from rl_rewards import models
from rl_rewards.runners import programs
from rl_rewards.runners.methods import base


def _gae(batch, gamma: float, lam: float):
  """(advantages [B, T], returns [B, T]) of the outcome reward."""
  mask = batch["response_mask"]
  rewards = core.outcome_token_rewards(batch["rewards"], mask)
  return core.gae(rewards, batch["values"], mask, gamma=gamma, lam=lam)


def gae(cfg, batch):
  """(whitened advantages [B, T], returns [B, T]) of the outcome reward."""
  advantages, returns = _gae(batch, cfg.gae_gamma, cfg.ppo.gae_lambda)
  return core.masked_whiten(advantages, batch["response_mask"]), returns


@functools.partial(jax.jit, static_argnames=("gamma", "lam"))
def _returns(batch, gamma: float, lam: float):
  """[B, T] value targets G_t = A_t + V_t (before whitening)."""
  return _gae(batch, gamma, lam)[1]


class PPO(base.Method):
  """`rl.method="ppo"`: the critic is the extra model `value`."""

  update_keys = ("old_values", "returns")

  def programs(self, model_config):
    tx = programs.rl_optimizer(self.cfg, self.cfg.ppo.value_learning_rate)
    return (
        programs.Pass("rl/values", "value", ("score",),
                      programs.values_pass(self.config, model_config)),
        programs.Update(
            "rl/value_update", "value", ("score",), tx,
            programs.value_step_fn(self.config, model_config, tx),
            {"old_values": jnp.float32, "returns": jnp.float32}))

  def init_models(self, ctx, params):
    return {"value": models.init_from_backbone(
        ctx.model_config, jax.device_get(params), ctx.rng("value_init"),
        heads=("score",))}

  def signals(self, ctx, fns, state, batch):
    values = fns["rl/values"](state["value"].params, batch["tokens"],
                              batch["attention_mask"])
    returns = _returns(dict(batch, values=values),
                       gamma=float(self.cfg.gae_gamma),
                       lam=float(self.cfg.ppo.gae_lambda))
    return state, {"values": values, "old_values": values,
                   "returns": returns}, {}

  def advantages(self, batch):
    a, _ = gae(self.cfg, batch)
    return a, {"outcome": a}

  def update(self, fns, state, minibatch):
    state = dict(state)
    state["value"], metrics = fns["rl/value_update"](state["value"],
                                                     minibatch)
    return state, metrics
