"""PURE: min-form credit assignment (Cheng et al., "Stop Summation", 2504.15275).

Step rewards r_k = 2p_k − 1 ∈ [−1, 1] from the verifier's P(step k correct)
are made min-form by `rl.pure.credit`:

  softmin      r*_k = softmax_k(−r/T)·r_k (T = `rl.pure.temperature`): the
               paper's transform, Σ_k r*_k → min_k r_k as T → 0;
  min          hard min-form, every step's return G_k = min_{j ≥ k} r_j;
  min_paper    hard min-form of §3.1: G_k = min_{j ≥ k} r_j up to the first
               argmin of r, 0 after it;

then the token-level RLOO baseline over the group (`rl.pure.baseline`),
γ = 1 returns, plus the verifiable reward
`rl.pure.verifiable_reward_coef`·RLOO(solved − 1) at the last token
(PURE-PRM+VR; 0 gives PURE-PRM), step-end tokens masked
(`rl.pure.mask_step_end_tokens`) and PURE's normalisation.
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


class PURE(base.Method):
  """`rl.method="pure"`."""

  reads_step_scores = True

  def check(self):
    base.require(self.cfg.group_size >= 2, "rl.group_size",
                 "PURE's leave-one-out baselines need at least 2 samples "
                 "per prompt.")

  def step_rewards(self, batch):
    """[B, S] r* of `rl.pure.credit` and the softmin temperature to use."""
    pure = self.cfg.pure
    rewards = 2.0 * batch["step_scores"] - 1.0
    if pure.credit == "softmin":
      return rewards, pure.temperature
    step_mask = core.step_mask_from_ids(batch["step_ids"], rewards.shape[1])
    form = "running_min" if pure.credit == "min" else "paper"
    return core.min_form_step_rewards(rewards, step_mask, form=form), None

  def advantages(self, batch):
    cfg, pure = self.cfg, self.cfg.pure
    rewards, temperature = self.step_rewards(batch)
    common = dict(baseline=pure.baseline,
                  mask_step_ends=pure.mask_step_end_tokens, normalize=True,
                  step_end_mask=batch["step_end_mask"])
    solved = batch["rewards"] if pure.verifiable_reward_coef > 0 else None
    a, _ = core.pure_advantages(
        rewards, batch["step_ids"], batch["response_mask"], cfg.group_size,
        temperature=temperature, solved=solved,
        verifiable_coef=pure.verifiable_reward_coef, **common)
    # The PRM part alone (no verifiable reward), for the diagnostics.
    process, _ = core.pure_advantages(
        rewards, batch["step_ids"], batch["response_mask"], cfg.group_size,
        temperature=temperature, **common)
    return a, {"process": process, "outcome": a - process}
