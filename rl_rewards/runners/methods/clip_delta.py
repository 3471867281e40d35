"""Clip/Delta refined PRM rewards (Gao et al., "On Designing Effective RL
Reward at Training Time for LLM Reasoning", 2410.15115).

  Clip:   r_k ← min(r_k − η, 0)            (every return ≤ 0: no reward for
                                            emitting more steps)
  Delta:  r_k ← r_k − r_{k+1}, last step kept (returns telescope to r_k)
  A_t = A^out + c·Σ_{j ≥ k(t)} r_j,

`rl.clip_delta.mode` (clip | delta | clip_delta), η = `rl.clip_delta.eta`,
c = `rl.process_coef`.
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base


class ClipDelta(base.Method):
  """`rl.method="clip_delta"`."""

  reads_step_scores = True

  def advantages(self, batch):
    cfg = self.cfg
    scores = batch["step_scores"]
    step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
    refined = scores
    if cfg.clip_delta.mode in ("clip", "clip_delta"):
      refined = core.clip_step_rewards(refined, step_mask,
                                       eta=cfg.clip_delta.eta)
    if cfg.clip_delta.mode in ("delta", "clip_delta"):
      refined = core.delta_step_rewards(refined, step_mask)
    returns = core.step_returns(refined, step_mask)
    process = core.steps_to_tokens(returns, batch["step_ids"])
    process = cfg.process_coef * jnp.where(batch["response_mask"] > 0,
                                           process, 0.0)
    outcome = base.outcome_token_advantages(cfg, batch)
    return outcome + process, {"outcome": outcome, "process": process}
