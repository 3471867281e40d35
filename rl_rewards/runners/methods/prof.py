"""PROF: process-consistency filtering before GRPO (Ye et al., "Beyond
Correctness: Harmonizing Process and Outcome Rewards through RL Training",
arXiv 2509.03403).

The PRM is a filter, not a reward. Each response gets a consistency score
(`core.prof_scores`, the reference code's rule)

  c_i = (1/H_i) Σ_k 2(p_{i,k} − p̄)(2y_i − 1),
  s_i = c_i − λ·1[H_i < min_steps or H_i > max_steps],

p_{i,k} the verifier's P(step k correct) (`rl.prm_source`: the trained
verifier or the step checker's 0/1 labels), H_i its scored steps (at most
`task.max_steps` slots: longer responses merge their last steps), p̄ the
mean step score of the batch, y_i = 1[outcome > ½]. Per group of n, with
N_+ correct and N_− incorrect rows and R = min(`rl.prof.num_remove`,
N_+ + N_−) (`core.prof_keep_mask`):

  r_+ = clip(round_half_even((N_+ − N_− + R)/2), 0, min(R, N_+)),
  r_− = min(R − r_+, N_−),

the r_+ correct and r_− incorrect rows of lowest s are dropped, and GRPO
runs on the outcome r over the kept rows only
(`core.kept_group_advantages`: mean and unbiased std of the kept rows of
the group; a lone kept row gets μ = 0, σ = 1, as in verl):

  A_i = (r_i − μ_kept)/(σ_kept + ε) on kept rows, 0 on dropped rows,

ε = `rl.advantage_eps`.

Dropped rows get no loss weight the way the accuracy filter's rows do:
`signals` multiplies `response_mask` by the keep mask, so the policy loss's
token counts, the KL and a refreshed verifier all see only the kept rows.
Rows the accuracy filter already dropped count neither as correct nor as
incorrect. The diagnostics' split is the GRPO advantage over all rows
(`outcome`, 0 on dropped rows) and what filtering changes (`process`).
"""

import functools

import jax
import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners import context as context_lib
from rl_rewards.runners.methods import base


def correct(rewards):
  """[B] bool: the outcome y_i (reward above ½)."""
  return rewards > 0.5


@functools.partial(jax.jit, static_argnames=("group_size", "num_remove",
                                             "min_steps", "max_steps",
                                             "length_penalty"))
def keep_mask(batch, *, group_size: int, num_remove: int, min_steps: int,
              max_steps: int, length_penalty: float):
  """[B] float 0/1 rows PROF keeps, among the rows with response tokens."""
  scores = batch["step_scores"]
  step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
  y = correct(batch["rewards"])
  critic = core.prof_scores(scores, step_mask, y, min_steps=min_steps,
                            max_steps=max_steps,
                            length_penalty=length_penalty)
  valid = jnp.sum(batch["response_mask"], axis=1) > 0
  keep = core.prof_keep_mask(critic, y, group_size, num_remove=num_remove,
                             sample_mask=valid)
  return keep.astype(jnp.float32)


@jax.jit
def _filtered(batch, keep):
  mask = batch["response_mask"] * keep[:, None].astype(
      batch["response_mask"].dtype)
  valid = jnp.sum(batch["response_mask"], axis=1) > 0
  fraction = jnp.sum(keep) / jnp.maximum(jnp.sum(valid), 1)
  return mask, {"train/prof_kept_fraction": fraction}


class PROF(base.Method):
  """`rl.method="prof"`."""

  reads_step_scores = True

  def check(self):
    cfg = self.cfg
    base.require(cfg.advantage_estimator == "grpo", "rl.advantage_estimator",
                 "PROF normalises the kept rows' outcomes by their group "
                 f"mean and std (GRPO); got {cfg.advantage_estimator!r}.")
    base.require(cfg.prof.num_remove < cfg.group_size, "rl.prof.num_remove",
                 f"removes {cfg.prof.num_remove} of every group of "
                 f"rl.group_size={cfg.group_size}: at least one row must "
                 "stay (the paper removes 4 of 8).")

  def keep(self, batch):
    """[B] 0/1 keep mask of the batch (`keep_mask` with `rl.prof`)."""
    prof = self.cfg.prof
    return keep_mask(batch, group_size=self.cfg.group_size,
                     num_remove=int(prof.num_remove),
                     min_steps=int(prof.min_steps),
                     max_steps=int(prof.max_steps),
                     length_penalty=float(prof.length_penalty))

  def signals(self, ctx, fns, state, batch):
    del ctx, fns
    keep = self.keep(batch)
    mask, record = _filtered(batch, keep)
    return state, {"response_mask": mask, "prof_keep": keep}, (
        context_lib.host_scalars(record))

  def advantages(self, batch):
    cfg = self.cfg
    seq = core.kept_group_advantages(
        batch["rewards"], batch["prof_keep"] > 0, cfg.group_size,
        eps=cfg.advantage_eps)
    a = core.broadcast_to_tokens(seq, batch["response_mask"])
    outcome = base.outcome_token_advantages(cfg, batch)
    return a, {"outcome": outcome, "process": a - outcome}
