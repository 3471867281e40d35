"""REINFORCE++ (Hu et al., 2501.03262), with and without the group baseline.

  rl.reinforce_pp.baseline="none" (REINFORCE++):
    r_t = r_outcome·1[t = t_last] − β·KL_t,  KL_t = log π_old − log π_ref (k1),
    G_t = Σ_{u ≥ t} γ^{u−t} r_u (reset after the last valid token),
    A = masked_whiten(G) over every valid token of the batch;
  rl.reinforce_pp.baseline="group" (REINFORCE++-baseline, verl):
    A = masked_whiten(r_i − μ_g tiled over the tokens); the KL, if any, is
    the loss term `rl.kl_coef`.

β = `rl.reinforce_pp.reward_kl_coef` (0 leaves the reference out), γ =
`rl.gae_gamma`. The statistics are batch-global and token-weighted
(`docs/algorithms.md`).
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


class ReinforcePP(base.Method):
  """`rl.method="reinforce_pp"`."""

  def __init__(self, config, verifier=None):
    super().__init__(config, verifier)
    own = config.rl.reinforce_pp
    self.reads_reference = own.baseline == "none" and own.reward_kl_coef > 0

  def advantages(self, batch):
    cfg, own, mask = self.cfg, self.cfg.reinforce_pp, batch["response_mask"]
    if own.baseline == "group":
      a, _ = core.reinforce_plus_plus_baseline(batch["rewards"], mask,
                                               cfg.group_size)
      return a, {"outcome": a}
    rewards = core.outcome_token_rewards(batch["rewards"], mask)
    if own.reward_kl_coef > 0:
      kl = core.kl_divergence(batch["old_logprobs"], batch["ref_logprobs"],
                              estimator="k1")
      rewards = rewards - own.reward_kl_coef * kl * mask
    a, _ = core.reinforce_plus_plus(rewards, mask, gamma=cfg.gae_gamma)
    return a, {"outcome": a}
