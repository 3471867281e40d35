"""TP-GRPO: thought-level process rewards with a capability-adaptive weight
(He et al., "Good Learners Think Their Thinking", 2507.23317; ICLR 2026).

Contiguous steps with the same verdict of a step verifier are merged into
thoughts (`core.merge_steps_by_label`). With r̂^o the GRPO advantage of the
outcome and r^c = α·acc_G the capability-adaptive weight (acc_G the
accuracy of the prompt's group), a correct response's correct thoughts keep
r̂^o and its incorrect ones get r̂^o − r^c; a wrong response's thoughts that
lead to its error keep r̂^o (≤ 0) and the others get 0
(`core.tp_grpo_advantages`, which says which parts follow the paper and
which are this implementation's reading of it). A step is good when the
verifier's P(correct) exceeds ½ (`prm_source="oracle"`: the step checker).
α = `rl.tp_grpo.alpha`; the outcome normalisation is `rl.advantage_estimator`.
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


class TPGRPO(base.Method):
  """`rl.method="tp_grpo"`."""

  reads_step_scores = True

  def advantages(self, batch):
    cfg = self.cfg
    a = core.tp_grpo_advantages(
        batch["step_scores"], batch["step_ids"], batch["response_mask"],
        batch["rewards"], cfg.group_size, alpha=cfg.tp_grpo.alpha,
        estimator=cfg.advantage_estimator, eps=cfg.advantage_eps)
    outcome = base.outcome_token_advantages(cfg, batch)
    return a, {"outcome": outcome, "process": a - outcome}
