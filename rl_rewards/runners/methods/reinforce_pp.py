"""REINFORCE++ (Hu et al., 2501.03262), with and without the group baseline.

  rl.reinforce_baseline="none" (REINFORCE++):
    r_t = r_outcome·1[t = t_last] − β·KL_t,  KL_t = log π_old − log π_ref (k1),
    G_t = Σ_{u ≥ t} γ^{u−t} r_u (reset after the last valid token),
    A = masked_whiten(G) over every valid token of the batch;
  rl.reinforce_baseline="group" (REINFORCE++-baseline, verl):
    A = masked_whiten(r_i − μ_g tiled over the tokens); the KL, if any, is
    the loss term `rl.kl_coef`.

β = `rl.reward_kl_coef` (0 leaves the reference out), γ = `rl.gae_gamma`.
The statistics are batch-global and token-weighted (spec/algorithms.md).
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


class ReinforcePP(base.Method):
  """`rl.method="reinforce_pp"`."""

  def __init__(self, config):
    super().__init__(config)
    self.reads_reference = (config.rl.reinforce_baseline == "none" and
                            config.rl.reward_kl_coef > 0)

  def check(self, verifier=None):
    base.require(self.cfg.reinforce_baseline in ("none", "group"),
                 "rl.reinforce_baseline", "must be none or group, got "
                 f"{self.cfg.reinforce_baseline!r}.")
    base.require(self.cfg.reinforce_baseline == "none" or
                 self.cfg.reward_kl_coef == 0, "rl.reward_kl_coef",
                 "REINFORCE++-baseline puts the KL in the loss "
                 "(rl.kl_coef), not in the reward; set it to 0.")

  def advantages(self, batch):
    cfg, mask = self.cfg, batch["response_mask"]
    if cfg.reinforce_baseline == "group":
      a, _ = core.reinforce_plus_plus_baseline(batch["rewards"], mask,
                                               cfg.group_size)
      return a, {"outcome": a}
    rewards = core.outcome_token_rewards(batch["rewards"], mask)
    if cfg.reward_kl_coef > 0:
      kl = core.kl_divergence(batch["old_logprobs"], batch["ref_logprobs"],
                              estimator="k1")
      rewards = rewards - cfg.reward_kl_coef * kl * mask
    a, _ = core.reinforce_plus_plus(rewards, mask, gamma=cfg.gae_gamma)
    return a, {"outcome": a}
