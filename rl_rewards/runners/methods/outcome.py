"""Outcome-only group baselines: GRPO, Dr. GRPO, RLOO.

  GRPO (Shao et al., DeepSeekMath, 2402.03300):  A_i = (r_i − μ_g)/(σ_g + ε)
  Dr. GRPO (Liu et al., 2503.20783):              A_i = r_i − μ_g
  RLOO (Ahmadian et al., 2402.14740):             A_i = r_i − mean_{j≠i} r_j

chosen by `rl.advantage_estimator` (grpo | drgrpo | rloo), the same on
every response token. No verifier, no extra model.
"""

from rl_rewards.runners.methods import base


class Outcome(base.Method):
  """`rl.method="outcome"`: the group advantage of the outcome reward."""
