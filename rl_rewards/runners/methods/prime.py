"""PRIME: process rewards from an online implicit PRM (Cui et al., 2502.01456).

The implicit PRM π_φ starts as a copy of the SFT policy; its token rewards
are r^φ_t = β·(log π_φ(y_t) − log π_ref(y_t)) (exactly 0 at the start). Each
RL step, after the accuracy filter (`rl.filter_accuracy`, PRIME's
[0.2, 0.8] group-accuracy range):

1. score the rollout with π_φ (before its update: one forward pass);
2. update π_φ with the cross-entropy of σ(β Σ_t log π_φ/π_ref) against the
   outcome labels, over the kept rows only (own optimizer state,
   `rl.prime.learning_rate`);
3. advantages (Eq. 5): per-source leave-one-out baselines (process rewards:
   `rl.prime.rloo_form`, "code" as PRIME's published runs or "paper" as
   Eq. 5), c_p·RLOO(r^φ) + c_o·RLOO(r^o) at the last token, γ = 1 returns,
   whitened over the kept tokens. `rl.prime.batch_norm` first rescales the
   process rewards by the batch's largest |return| (the reference code's
   `batch_norm` option).
"""

import jax
import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import programs
from rl_rewards.runners.methods import base
from rl_rewards.sharding import mesh as mesh_lib


class PRIME(base.Method):
  """`rl.method="prime"`: the implicit PRM is the extra model `implicit_prm`."""

  reads_reference = True

  def check(self):
    cfg = self.cfg
    base.require(cfg.group_size >= 2, "rl.group_size",
                 "PRIME's leave-one-out baselines need at least 2 samples "
                 "per prompt.")
    base.require(cfg.micro_batch_size % cfg.group_size == 0,
                 "rl.micro_batch_size",
                 f"must be a multiple of group_size ({cfg.group_size}) for "
                 "prime: the implicit-PRM update ranks the samples of each "
                 "prompt.")

  def programs(self, model_config):
    tx = programs.rl_optimizer(self.cfg, self.cfg.prime.learning_rate)
    return (
        programs.Pass("rl/implicit_prm_logprobs", "implicit_prm", ("lm",),
                      programs.logprob_pass(self.config, model_config)),
        programs.Update(
            "rl/implicit_prm_update", "implicit_prm", ("lm",), tx,
            programs.implicit_prm_step_fn(self.config, model_config, tx),
            {"ref_logprobs": jnp.float32, "labels": jnp.float32},
            rows="rollout", widths={"labels": 0}))

  def init_models(self, ctx, params):
    return {"implicit_prm": params}

  def signals(self, ctx, fns, state, batch):
    mask = batch["response_mask"]
    logp = fns["rl/implicit_prm_logprobs"](state["implicit_prm"].params,
                                           batch["tokens"],
                                           batch["attention_mask"])
    rewards = core.implicit_token_rewards(logp, batch["ref_logprobs"], mask,
                                          beta=self.cfg.prime.beta)
    record = {"prm/implicit_reward_abs_mean": float(
        jnp.sum(jnp.abs(rewards)) / jnp.maximum(jnp.sum(mask), 1))}
    prm_batch = {k: batch[k] for k in ("tokens", "attention_mask",
                                       "response_mask", "ref_logprobs")}
    prm_batch["labels"] = batch["rewards"]
    state = dict(state)
    state["implicit_prm"], metrics = fns["rl/implicit_prm_update"](
        state["implicit_prm"],
        jax.device_put(prm_batch, mesh_lib.batch_sharding(ctx.mesh)))
    record.update({f"train/{k}": v for k, v in
                   context_lib.host_scalars(metrics).items()})
    return state, {"implicit_rewards": rewards}, record

  def advantages(self, batch):
    cfg, own = self.cfg, self.cfg.prime
    kwargs = dict(form=own.rloo_form, batch_norm=own.batch_norm)
    a, _ = core.prime_advantages(
        batch["implicit_rewards"], batch["rewards"], batch["response_mask"],
        cfg.group_size, process_coef=own.process_coef,
        outcome_coef=own.outcome_coef, **kwargs)
    outcome_only, _ = core.prime_advantages(
        jnp.zeros_like(batch["implicit_rewards"]), batch["rewards"],
        batch["response_mask"], cfg.group_size, process_coef=0.0,
        outcome_coef=own.outcome_coef, **kwargs)
    return a, {"outcome": outcome_only, "process": a - outcome_only}
