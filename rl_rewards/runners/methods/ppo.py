"""PPO with a learned value model and GAE (Schulman et al., 1707.06347).

  δ_t = r_t + γ V_{t+1} − V_t,  A_t = δ_t + γλ A_{t+1},  A ← masked_whiten(A),
  value targets G_t = A_t + V_t (before whitening),

with the outcome reward on the last response token (`rl.ppo.reward=
"outcome"`), or with dense PRM step rewards (`rl.ppo.reward="prm"`: PPO
with a process reward model, Math-Shepherd §3.3, arXiv 2312.08935; Let's
Reinforce Step by Step, arXiv 2311.05821):

  R_t = Σ_k c_s·p_k·1[t = e_k] + s·1[t = t_last]
  (`core.process_ppo_advantages`),

p_k the verifier's P(step k correct) (`rl.prm_source`: the trained verifier
or the step checker's 0/1 labels), e_k the last token of step k, s the
outcome, c_s = `rl.ppo.step_reward_coef`; the final step's score and the
outcome add on the last token. Every correct-looking step earns a positive
reward, so watch `train/steps_per_response` for step padding. The value
model starts
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


def _gae(batch, gamma: float, lam: float, step_reward_coef=None):
  """(advantages [B, T], returns [B, T]) of the outcome reward, plus the
  step rewards c_s·p_k at step ends unless `step_reward_coef` is None."""
  mask = batch["response_mask"]
  if step_reward_coef is None:
    rewards = core.outcome_token_rewards(batch["rewards"], mask)
    return core.gae(rewards, batch["values"], mask, gamma=gamma, lam=lam)
  return core.process_ppo_advantages(
      step_reward_coef * batch["step_scores"], batch["step_ids"], mask,
      batch["values"], gamma=gamma, lam=lam, outcome_scores=batch["rewards"])


def _step_reward_coef(cfg):
  return cfg.ppo.step_reward_coef if cfg.ppo.reward == "prm" else None


def gae(cfg, batch):
  """(whitened advantages [B, T], returns [B, T]) of `rl.ppo.reward`."""
  advantages, returns = _gae(batch, cfg.gae_gamma, cfg.ppo.gae_lambda,
                             _step_reward_coef(cfg))
  return core.masked_whiten(advantages, batch["response_mask"]), returns


@functools.partial(jax.jit,
                   static_argnames=("gamma", "lam", "step_reward_coef"))
def _returns(batch, gamma: float, lam: float, step_reward_coef=None):
  """[B, T] value targets G_t = A_t + V_t (before whitening)."""
  return _gae(batch, gamma, lam, step_reward_coef)[1]


class PPO(base.Method):
  """`rl.method="ppo"`: the critic is the extra model `value`."""

  update_keys = ("old_values", "returns")

  def __init__(self, config, verifier=None):
    super().__init__(config, verifier)
    self.reads_step_scores = self.reads_step_scores_of(config)

  @classmethod
  def reads_step_scores_of(cls, config) -> bool:
    return config.rl.ppo.reward == "prm"

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
    coef = _step_reward_coef(self.cfg)
    returns = _returns(dict(batch, values=values),
                       gamma=float(self.cfg.gae_gamma),
                       lam=float(self.cfg.ppo.gae_lambda),
                       step_reward_coef=None if coef is None else float(coef))
    return state, {"values": values, "old_values": values,
                   "returns": returns}, {}

  def advantages(self, batch):
    a, _ = gae(self.cfg, batch)
    if self.cfg.ppo.reward == "outcome":
      return a, {"outcome": a}
    # The split: GAE of the outcome alone (same values, same whitening
    # statistics' kind) and the rest.
    outcome = core.masked_whiten(
        _gae(batch, self.cfg.gae_gamma, self.cfg.ppo.gae_lambda)[0],
        batch["response_mask"])
    return a, {"outcome": outcome, "process": a - outcome}

  def update(self, fns, state, minibatch):
    state = dict(state)
    state["value"], metrics = fns["rl/value_update"](state["value"],
                                                     minibatch)
    return state, metrics
