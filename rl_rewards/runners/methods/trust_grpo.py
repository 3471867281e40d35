"""Trust-GRPO: an annealed, trust-weighted thinking reward (Fan et al.,
"SophiaVL-R1: Reinforcing MLLMs Reasoning with Thinking Reward",
arXiv 2505.17018).

  r_i = a_i + w_g·h'_i,   w_g = b·e^{−s/T}·trust_g,
  trust_g = e^{μ_c − μ_w} if μ_c < μ_w (and the group has a correct row)
            else 1,

then the group advantage of r (`rl.advantage_estimator`; the config sets
GRPO) on every response token (`core.trust_weighted_rewards`, which gives
the reference code's rules: groups whose answers are all ≥
`solved_threshold` or all ≤ `failed_threshold` get the outcome only; h'_i =
h_i where a_i ≥ `judge_threshold`, else 0; μ_c, μ_w the mean h' of the
correct (a ≥ `correct_threshold`) and the other rows). a_i is the outcome,
h_i the thinking reward: here the mean over the response's steps of the
verifier's P(step k correct) (`rl.prm_source`; the paper asks a thinking
reward model for one score of the whole reasoning), s the RL step (0 on the
first rollout), b = `rl.trust_grpo.base_weight`, T =
`rl.trust_grpo.anneal_steps` (the code's 0.3 and 500).

With 0/1 outcomes (the arithmetic task) a wrong row's a = 0 is below
`judge_threshold`, so h' = 0 there, μ_w = 0 ≤ μ_c and the trust factor is
always 1: the method is then r = a + b·e^{−s/T}·h on the correct rows of
mixed groups (an annealed Posterior-GRPO). The trust factor acts on
graded outcomes (partial credit in [0, 1]).

The RL step comes from the policy's update counter, which the loop
advances `rl.epochs`·`rl.minibatches` times per RL step (skipped updates
included), so a resumed run anneals exactly as an uninterrupted one.
The diagnostics' split: the group advantage of the outcome alone
(`outcome`) and what the thinking reward changes (`process`).
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners import context as context_lib
from rl_rewards.runners.methods import base
from rl_rewards.runners.methods import posterior_grpo


class TrustGRPO(base.Method):
  """`rl.method="trust_grpo"`."""

  reads_step_scores = True

  def rl_step(self, state):
    """The RL step s of the rollout about to be updated (a device scalar)."""
    updates = self.cfg.epochs * self.cfg.minibatches
    return state["policy"].step // updates

  def signals(self, ctx, fns, state, batch):
    del ctx, fns, batch
    step = self.rl_step(state)
    c = self.cfg.trust_grpo
    scale = c.base_weight * jnp.exp(-step.astype(jnp.float32) /
                                    c.anneal_steps)
    return state, {"rl_step": step}, context_lib.host_scalars(
        {"train/trust_weight_scale": scale})

  def rewards(self, batch):
    """([B] rewards r, [B] weights w_g) of `core.trust_weighted_rewards`."""
    c = self.cfg.trust_grpo
    thinking = posterior_grpo.mean_step_scores(batch["step_scores"],
                                               batch["step_ids"])
    return core.trust_weighted_rewards(
        batch["rewards"], thinking, self.cfg.group_size,
        step=batch["rl_step"], anneal_steps=c.anneal_steps,
        base_weight=c.base_weight, correct_threshold=c.correct_threshold,
        judge_threshold=c.judge_threshold,
        solved_threshold=c.solved_threshold,
        failed_threshold=c.failed_threshold)

  def advantages(self, batch):
    cfg = self.cfg
    rewards, _ = self.rewards(batch)
    seq = core.group_advantages(rewards, cfg.group_size,
                                estimator=cfg.advantage_estimator,
                                eps=cfg.advantage_eps)
    a = core.broadcast_to_tokens(seq, batch["response_mask"])
    outcome = base.outcome_token_advantages(cfg, batch)
    return a, {"outcome": outcome, "process": a - outcome}
