"""Posterior-GRPO: the thinking reward counts only when the outcome is
correct (Fan et al., "Posterior-GRPO: Rewarding Reasoning Processes in Code
Generation", arXiv 2508.05170, §3.3).

  R_i = r_i + 1[r_i > τ]·c·R_t,i,   R_t,i = (1/H_i) Σ_{k<H_i} p_{i,k},

then the group advantage of R (`rl.advantage_estimator`; the config sets
GRPO's (R − μ_g)/(σ_g + ε)) on every response token
(`core.posterior_rewards`). r_i is the verifiable outcome, τ =
`rl.posterior_grpo.correct_threshold`, c = `rl.posterior_grpo.thinking_coef`
(1 in the paper) and R_t the thinking reward. The paper scores the whole
reasoning with a reward model in [0, 1]; here it is the mean over the
response's H_i steps of the verifier's P(step k correct) (`rl.prm_source`:
the trained verifier, or the step checker's 0/1 labels: the fraction of
correct steps), 0 for a response without steps. The paper has no format
reward on this task (R_f = 0). Wrong responses get no thinking reward, so a
verifier cannot pay for a wrong answer: the gate is what guards against
reward hacking.

The diagnostics' split: the group advantage of the outcome alone
(`outcome`) and what the thinking reward changes (`process`).
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base


def mean_step_scores(step_scores, step_ids):
  """[B] mean of each response's step scores over its steps (0: none)."""
  mask = core.step_mask_from_ids(step_ids, step_scores.shape[1])
  count = jnp.sum(mask, axis=1)
  total = jnp.sum(jnp.where(mask, step_scores, 0), axis=1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), 0)


class PosteriorGRPO(base.Method):
  """`rl.method="posterior_grpo"`."""

  reads_step_scores = True

  def rewards(self, batch):
    """[B] composite reward R of `core.posterior_rewards`."""
    c = self.cfg.posterior_grpo
    thinking = mean_step_scores(batch["step_scores"], batch["step_ids"])
    return core.posterior_rewards(batch["rewards"], c.thinking_coef * thinking,
                                  correct_threshold=c.correct_threshold)

  def advantages(self, batch):
    cfg = self.cfg
    seq = core.group_advantages(self.rewards(batch), cfg.group_size,
                                estimator=cfg.advantage_estimator,
                                eps=cfg.advantage_eps)
    a = core.broadcast_to_tokens(seq, batch["response_mask"])
    outcome = base.outcome_token_advantages(cfg, batch)
    return a, {"outcome": outcome, "process": a - outcome}
