"""MRT: a dense progress bonus per episode (Qu et al., "Optimizing Test-Time
Compute via Meta Reinforcement Fine-Tuning", 2503.07572).

The response is cut into episodes and a meta-prover μ (the model forced to
answer after a prefix) scores each prefix with its success J_j; each
episode earns its progress (`core.mrt_advantages`, `core.mrt_progress`):

  A_{i,t} = A^out_i + α·r_prg(z_{i,k(t)}),
  r_prg(z_j) = J_j − J_{j−1},  J_{−1} = J_r(μ(·|c))   (reference="previous"),
  r_prg(z_j) = J_j − J_r(μ(·|c))                      (reference="prompt"),

A^out the group advantage of the outcome (`rl.advantage_estimator`), α =
`rl.mrt.alpha`, reference = `rl.mrt.reference`.

Here an episode is one of the task's steps (the arithmetic task's lines, or
the turns of a hidden-operands episode; the paper's episodes are blocks of a
long thinking stream cut at "Wait", "Alternatively", ...). Where J comes
from is `rl.mrt.j`:

- "forced": J_j is exactly the success of μ answering at once after step j.
  The answer probe (`train/answer_probe.py`, the pass IGPO uses) appends the
  true answer a* (the task's answer line and its end, e.g. "#015" + EOS)
  after the prompt and after each step and reads
    J_j = exp(Σ_t log π(a*_t | z_{0:j}, c, a*_<t)),
  the probability that π_old, sampling at temperature 1, writes a* right
  after the prefix (J_{−1}: after the prompt). Since a* is the only right
  answer, that is J_r(μ(·|z_{0:j}, c)) with no sampling and no verifier (a
  right answer written another way is not counted). The last step has
  already answered: its J is the response's outcome reward R.
- "scores" (default): J is read from the loop's step signal
  (`reads_step_scores`, as PAV reads it) rather than by sampling forced
  answers:
- `rl.prm_source="oracle"`: the step checker's perfect prover, J_j = 1
  until the first wrong step and 0 after, J_{−1} = 1: the first wrong step
  loses α ("previous"), or every step from it on does ("prompt");
- `"model"`: the trained verifier's Q̂ of each step prefix (`q_values`) and
  V̂ of the question (`v_init`). These are the success of the policy
  continuing from the prefix, not of μ answering at once: an approximation
  of J.
The paper's exact α and its code's trainer were not available (the public
code replaces GRPO's baseline by the termination reward,
`core.termination_advantages`, which this module does not use).
"""

import jax.numpy as jnp

from rl_rewards import core
from rl_rewards.runners.methods import base
from rl_rewards.runners.methods import igpo


class MRT(base.Method):
  """`rl.method="mrt"`."""

  reads_step_scores = True

  @classmethod
  def reads_step_scores_of(cls, config) -> bool:
    return config.rl.mrt.j != "forced"

  def __init__(self, config, verifier=None):
    super().__init__(config, verifier)
    forced = config.rl.mrt.j == "forced"
    self.reads_step_scores = not forced
    self.reads_answers = forced

  def programs(self, model_config):
    return ((igpo.probe_pass(self.config, model_config),)
            if self.reads_answers else ())

  def signals(self, ctx, fns, state, batch):
    if not self.reads_answers:
      return state, {}, {}
    _, total = igpo.run_probe(fns, state, batch, self.config.task.max_steps)
    j = jnp.exp(total)  # [B, S+1]: after the prompt, then after each step.
    steps = core.num_steps_per_row(batch["step_ids"])
    last = (jnp.arange(j.shape[1] - 1)[None, :] == (steps - 1)[:, None])
    q = jnp.where(last, batch["rewards"][:, None], j[:, 1:])
    record = {"train/mrt_forced_j_initial": float(jnp.mean(j[:, 0]))}
    return state, {"q_values": q, "v_init": j[:, 0]}, record

  def check(self):
    if self.reads_answers:
      igpo.check_answer_task(self.config, "MRT with rl.mrt.j='forced'")
      return
    verifier = self.verifier
    if self.cfg.prm_source == "oracle" or verifier is None:
      return
    base.require(verifier.model in ("head", "generative"), "prm.model",
                 "MRT reads the success after each step prefix and of the "
                 "bare question from a score head or an LM head; an "
                 f"{verifier.model!r} verifier has no trained V(question).")
    base.require(verifier.target in ("soft", "prover"), "prm.target",
                 "MRT's J is a success probability (target=soft or "
                 f"prover), got a verifier trained on {verifier.target!r} "
                 "labels.")
    base.require(verifier.value_trained, "prm.value_weight",
                 "the verifier's V(question) was not trained (value_weight "
                 "0): the first episode's progress is measured from it.")

  def advantages(self, batch):
    cfg = self.cfg
    seq = base.outcome_advantages(cfg, batch)
    a = core.mrt_advantages(seq, batch["q_values"], batch["v_init"],
                            batch["step_ids"], batch["response_mask"],
                            alpha=cfg.mrt.alpha, reference=cfg.mrt.reference)
    outcome = core.broadcast_to_tokens(seq, batch["response_mask"])
    return a, {"outcome": outcome, "process": a - outcome}
