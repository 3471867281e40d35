"""FAPO: flawed-positive penalty (Ding et al., "FAPO: Flawed-Aware Policy
Optimization for Efficient and Reliable Reasoning", 2510.22543).

A correct response whose process the critic flags is a "flawed positive"
and loses λ = `rl.fapo.penalty` from the ±1 outcome reward
(`core.fapo_rewards`):

  R_i = (correct_i ? +1 : −1) − λ·1[correct_i ∧ flawed_i],

then GRPO: A_i = group advantage of R (`rl.advantage_estimator`) on every
response token. λ = 1 (the default) is the authors' code, which scores a
flawed positive 0.

The critic is the step verifier the run has. FAPO's GenRM returns the index
of the earliest wrong step (−1 for none); here a response is flawed when
some step of it is judged wrong:

  flawed_i = ∃ step k of response i with s_{i,k} < τ,

s the rollout's `step_scores` (P(step k correct)) and τ =
`rl.fapo.threshold`:
- `rl.prm_source="oracle"`: the task's step checker (0/1 labels), so a
  response is flawed exactly when it has a first wrong step;
- `"model"`: the trained verifier's scores; the generative PRM (an LM head
  fine-tuned as a step judge, `configs/fapo.py`'s default) is the natural
  stand-in for FAPO's LLM critic.
A response is correct when its outcome reward exceeds ½. The critic is asked
about every response (FAPO queries it only for correct ones; the verdict of
an incorrect one is ignored by the rule).

`parts`: `outcome` is the same GRPO advantage of the unpenalised ±1 reward
(λ = 0), `process` what the penalty changes.
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base


class FAPO(base.Method):
  """`rl.method="fapo"`."""

  reads_step_scores = True

  def flawed(self, batch):
    """[B] bool: some valid step scored below `rl.fapo.threshold`."""
    scores = batch["step_scores"]
    step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
    return jnp.any(step_mask & (scores < self.cfg.fapo.threshold), axis=1)

  def _token_advantages(self, batch, correct, flawed, penalty):
    cfg = self.cfg
    rewards = core.fapo_rewards(correct, flawed, penalty=penalty)
    seq = core.group_advantages(rewards, cfg.group_size,
                                estimator=cfg.advantage_estimator,
                                eps=cfg.advantage_eps)
    return core.broadcast_to_tokens(seq, batch["response_mask"])

  def advantages(self, batch):
    correct = batch["rewards"] > 0.5
    flawed = self.flawed(batch)
    a = self._token_advantages(batch, correct, flawed, self.cfg.fapo.penalty)
    outcome = self._token_advantages(batch, correct, flawed, 0.0)
    return a, {"outcome": outcome, "process": a - outcome}
