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

Here an episode is one of the task's steps (the arithmetic task's lines; the
paper's episodes are blocks of a long thinking stream cut at "Wait",
"Alternatively", ...), and J is read from the loop's step signal
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

from rl_rewards import core
from rl_rewards.runners.methods import base


class MRT(base.Method):
  """`rl.method="mrt"`."""

  reads_step_scores = True

  def check(self):
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
