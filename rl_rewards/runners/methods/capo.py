"""CAPO: token penalties on the steps a critic marks wrong (Xie et al.,
"CAPO: Towards Enhancing LLM Reasoning through Verifiable Generative Credit
Assignment", 2508.02298).

CAPO's token reward (`core.capo_token_rewards`) is the weighted outcome
minus a penalty on every token of a step the critiques mark wrong:

  R_{i,t} = W_whole·r_v,i − W_process·e_{i,k(t)},

e the wrongness of step k after voting over C critiques
(`core.vote_wrong_steps`), W_whole = `rl.capo.w_whole` > W_process =
`rl.capo.w_process` (a correct-but-flawed response stays above an incorrect
one).

Critiques: the verifier's per-step verdicts, step k wrong when its score
s_{i,k} < τ = `rl.capo.threshold` (`rl.prm_source="oracle"`: the task's step
checker's 0/1 labels; `"model"`: the trained verifier's P(step correct), the
generative PRM by default, standing in for CAPO's LLM-as-GenPRM). With C =
`rl.capo.critiques` = 1 (the default) that is one greedy critique per
response, and every voting rule returns its verdicts. With C > 1 the
critic is queried C times, as the paper prompts its GenPRM several times:
each critique is sampled from the verifier (`core.sample_critiques`: step k
marked wrong with probability 1 − s_{i,k}, the generative verifier's
"correct" verdict sampled at temperature 1; τ is not used), and the
critiques are combined by `rl.capo.voting` (majority, intersection or
average; `core.vote_wrong_steps`). The step checker's 0/1 labels give C
identical critiques. The samples' key depends on (seed, policy update
count) only, so a resumed run draws the same critiques.

Advantages: the paper's normalisation of the token rewards into advantages
was not verified (the authors' code is unreleased). Here the outcome term
is replaced by its group advantage and the penalty kept as it is:

  A_{i,t} = m_{i,t}·(W_whole·Â_i − W_process·e_{i,k(t)}),

Â the group advantage of r_v (`rl.advantage_estimator`), i.e. R with the
outcome term baselined within the prompt's group. `parts`: `outcome` is
W_whole·Â, `process` the penalty −W_process·e.
"""

import jax
import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base


class CAPO(base.Method):
  """`rl.method="capo"`."""

  reads_step_scores = True

  def signals(self, ctx, fns, state, batch):
    """With C > 1 critiques, samples them (`critique_flags` [B, C, S])."""
    own = self.cfg.capo
    if own.critiques == 1:
      return state, {}, {}
    scores = batch["step_scores"]
    step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
    key = ctx.rng("capo/critiques", int(state["policy"].step))
    flags = _sample(key, scores, step_mask, own.critiques)
    votes = jnp.mean(flags.astype(jnp.float32), axis=1)
    # Steps on which the critiques disagree (neither all wrong nor all
    # right): what voting decides.
    split = jnp.sum((votes > 0) & (votes < 1)) / jnp.maximum(
        jnp.sum(step_mask), 1)
    return state, {"critique_flags": flags}, {
        "train/capo/split_verdict_steps": float(split)}

  def wrongness(self, batch):
    """[B, S] voted wrongness of each valid step."""
    own = self.cfg.capo
    if "critique_flags" in batch:
      return core.vote_wrong_steps(batch["critique_flags"], voting=own.voting)
    scores = batch["step_scores"]
    step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
    flags = step_mask & (scores < own.threshold)
    return core.vote_wrong_steps(flags[:, None, :], voting=own.voting)

  def advantages(self, batch):
    cfg, own = self.cfg, self.cfg.capo
    seq = base.outcome_advantages(cfg, batch)
    a = core.capo_token_rewards(seq, self.wrongness(batch), batch["step_ids"],
                                batch["response_mask"], w_whole=own.w_whole,
                                w_process=own.w_process)
    outcome = own.w_whole * core.broadcast_to_tokens(seq,
                                                     batch["response_mask"])
    return a, {"outcome": outcome, "process": a - outcome}


_sample = jax.jit(core.sample_critiques, static_argnames=("num_critiques",))
