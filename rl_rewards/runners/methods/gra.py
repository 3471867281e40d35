"""G-RA: gated reward accumulation (Sun et al., arXiv 2508.10548).

Immediate (turn- or step-level) rewards are accumulated into the return
only when the high-level (outcome) reward meets a threshold Δ, so a dense
critic cannot pay for turns of an episode that failed its goal:

  u_{b,k} = β·s_{b,k}                  (immediate reward of turn k)
  g_b     = 1[r_b ≥ Δ]                 (the gate, on the outcome r_b)
  G_{b,k} = r_b + g_b·Σ_{j ≥ k} u_{b,j}  (gated return from turn k)
  R_b     = G_{b,0}                    (the episode's gated return)
  A_{b,t} = G_{b,k(t)} − mean_{b' ∈ group(b)} R_{b'}

on every policy token t of turn k(t): the return-to-go of PPO at γ = λ = 1
with the gated rewards, and the group mean of the episodes' returns as the
baseline (Dr. GRPO's centring, no std). s_{b,k} are the step scores
(`reads_step_scores`): per turn the oracle's 0/1 progress labels
(`rl.prm_source="oracle"` on the hidden-operands task), or a trained
verifier's P(step correct). With β = 0 (or Δ above every reward) it is the
outcome-only Dr. GRPO advantage.

Keys (`config.rl.gra`): `threshold` Δ (default 1.0: only correct episodes
collect turn rewards), `turn_reward` β (default 0.1).
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base


def gated_returns(rewards, step_scores, step_ids, *, threshold: float,
                  turn_reward: float):
  """[B, S] gated returns-to-go G_{b,k} (see the module docstring).

  Args:
    rewards: [B] outcome rewards r_b.
    step_scores: [B, S] immediate scores s_{b,k} (turns beyond the row's
      last are ignored).
    step_ids: [B, T] turn/step ids, −1 off the policy's tokens.
    threshold: Δ.
    turn_reward: β.

  Returns:
    [B, S] float32; G_{b,0} is the episode's return R_b.
  """
  num_steps = step_scores.shape[1]
  step_mask = core.step_mask_from_ids(step_ids, num_steps)
  rewards = rewards.astype(jnp.float32)
  gate = (rewards >= threshold).astype(jnp.float32)
  immediate = turn_reward * step_scores.astype(jnp.float32) * step_mask
  to_go = jnp.cumsum(immediate[:, ::-1], axis=1)[:, ::-1]
  return rewards[:, None] + gate[:, None] * to_go


class GRA(base.Method):
  """`rl.method="gra"`."""

  reads_step_scores = True

  def check(self):
    base.require(self.cfg.advantage_estimator == "drgrpo",
                 "rl.advantage_estimator",
                 "G-RA's baseline is the group mean of the gated returns, "
                 "with no std (Dr. GRPO's centring); set drgrpo, got "
                 f"{self.cfg.advantage_estimator!r}.")

  def advantages(self, batch):
    cfg = self.cfg
    returns = gated_returns(batch["rewards"], batch["step_scores"],
                            batch["step_ids"], threshold=cfg.gra.threshold,
                            turn_reward=cfg.gra.turn_reward)
    n = cfg.group_size
    baseline = jnp.repeat(returns[:, 0].reshape(-1, n).mean(axis=1), n)
    mask = batch["response_mask"].astype(jnp.float32)
    a = (core.steps_to_tokens(returns, batch["step_ids"]) -
         baseline[:, None]) * mask
    outcome = base.outcome_token_advantages(cfg, batch, "drgrpo")
    return a, {"outcome": outcome, "process": a - outcome}
