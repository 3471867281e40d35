"""PAV: process advantage verifiers as dense rewards (Setlur et al., 2410.08146).

Effective reward of PAV-RL (Eq. 5), on every token of step k:

  A_{b,t} = (r_b − baseline_g) + α·A^μ_{b,k(t)},
  A^μ_k = Q^μ_k − Q^μ_{k−1},  Q^μ_0 = V^μ(question),

with μ = Best-of-K(π): Q^μ = 1 − (1 − Q^π)^K (App. D). The outcome term is
`rl.advantage_estimator`'s centred group advantage (drgrpo: r − μ_g; rloo:
r − mean of the others) and neither term is divided by a group std, so α
means what it means in the paper in every group (a std-normalised outcome
term would scale α by 1/σ_g, e.g. 2.8× in a 1-of-8 group).

Where Q^π comes from:
- a score-head or generative verifier trained on Monte-Carlo Q̂^π
  (`prm.target="soft"`): Q^μ = BoK(Q^π, `rl.pav.prover_k`);
- one trained on the prover's values (`prm.target="prover"`): its scores
  already are Q^μ of its labels' prover and are used as they are
  (`rl.pav.prover_k` must name that K);
- the task's step checker (`rl.prm_source="oracle"`): a perfect prover's
  0/1 values.
The verifier must have learned V(question) (its `value_weight` > 0): the
first step's progress is measured from it.
"""

from rl_rewards import core
from rl_rewards.runners.methods import base


def prover_advantages(q_values, v_init, step_ids, k: int):
  """[B, S] A^μ = progress of Q^μ = BoK(Q, k) (k = 1: Q is already Q^μ)."""
  step_mask = core.step_mask_from_ids(step_ids, q_values.shape[1])
  q_mu = core.best_of_k(q_values, k)
  v_mu = core.best_of_k(v_init, k)
  return core.progress(q_mu, v_mu, step_mask)


class PAV(base.Method):
  """`rl.method="pav"`."""

  reads_step_scores = True

  def __init__(self, config, verifier=None):
    super().__init__(config, verifier)
    # K of the second Best-of-K: none (1) when the verifier's scores are
    # already Q^μ of its labels' prover.
    self.k = (1 if verifier is not None and verifier.target == "prover"
              else config.rl.pav.prover_k)

  def check(self):
    cfg, verifier = self.cfg, self.verifier
    base.require(cfg.advantage_estimator in ("drgrpo", "rloo"),
                 "rl.advantage_estimator",
                 "PAV's effective reward (r − baseline) + α·A^μ is not "
                 "divided by a group std; use drgrpo (r − group mean, the "
                 f"paper's form) or rloo, got {cfg.advantage_estimator!r}.")
    if cfg.prm_source == "oracle" or verifier is None:
      return
    base.require(verifier.model in ("head", "generative"), "prm.model",
                 f"a PAV reads Q^π and V^π from a score head or an LM head; "
                 f"an {verifier.model!r} verifier has no trained V^π.")
    base.require(verifier.target in ("soft", "prover"), "prm.target",
                 "a PAV predicts Q^π (target=soft) or Q^μ (target=prover), "
                 f"got a verifier trained on {verifier.target!r} labels.")
    base.require(verifier.value_trained, "prm.value_weight",
                 "the verifier's V(question) was not trained (value_weight "
                 "0): A^μ of the first step needs it.")
    if verifier.target == "prover":
      base.require(cfg.pav.prover_k == verifier.prover_k, "rl.pav.prover_k",
                   f"the verifier predicts Q^μ of a Best-of-"
                   f"{verifier.prover_k} prover (its labels); set "
                   f"rl.pav.prover_k={verifier.prover_k}.")

  def advantages(self, batch):
    seq = base.outcome_advantages(self.cfg, batch)
    step_adv = prover_advantages(batch["q_values"], batch["v_init"],
                                 batch["step_ids"], self.k)
    a = core.pav_advantages(seq, step_adv, batch["step_ids"],
                            batch["response_mask"], alpha=self.cfg.pav.alpha)
    outcome = core.broadcast_to_tokens(seq, batch["response_mask"])
    return a, {"outcome": outcome, "process": a - outcome}
