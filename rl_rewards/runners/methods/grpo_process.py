"""GRPO with process supervision (Shao et al., DeepSeekMath §4.1.3, 2402.03300).

  r̃_{i,k} = (r_{i,k} − mean(R_g)) / (std(R_g) + ε)   over all valid step
             rewards R_g of the prompt's samples,
  A_{i,t} = A^out_i + c·Σ_{k: e_k ≥ t} r̃_{i,k}       (sum-form, γ = 1),

with r the verifier's step scores and c = `rl.process_coef`: the sum-form
return that min-form credit assignment (PURE) argues against.
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


class GRPOProcess(base.Method):
  """`rl.method="grpo_process"`."""

  reads_step_scores = True

  def advantages(self, batch):
    scores = batch["step_scores"]
    step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
    process = self.cfg.process_coef * core.grpo_process_advantages(
        scores, step_mask, batch["step_ids"], self.cfg.group_size,
        eps=self.cfg.advantage_eps)
    outcome = base.outcome_token_advantages(self.cfg, batch)
    return outcome + process, {"outcome": outcome, "process": process}
