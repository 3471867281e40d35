"""MRT: the outcome advantage plus a progress bonus per episode (step).

    python -m experiments.train --config=configs/mrt.py --workdir=runs/mrt
    python -m experiments.train --config=configs/mrt.py:source=oracle \\
        --workdir=runs/mrt_oracle                # the step checker's prover
    python -m experiments.train --config=configs/mrt.py:reference=prompt \\
        --workdir=runs/mrt_prompt                # J_j - J(question)
    python -m experiments.train --config=configs/mrt.py:j=forced \\
        --workdir=runs/mrt_forced                # J of the forced answer

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`; `source=oracle` runs sft -> rl). An episode is one step of the
task; the success J after each step prefix is the verifier's Q-hat (a score
head on Monte-Carlo labels with its V(question) head, as PAV's), or with
`source=oracle` the step checker's perfect prover (1 until the first wrong
step). Each step's tokens get A_out + alpha * (J_j - J_{j-1}), J_{-1} =
V(question) (rl_rewards/runners/methods/mrt.py); the outcome term is Dr.
GRPO's r - group mean, so alpha weighs the bonus the same in every group.

`j=forced` (stages sft -> rl, no verifier): J_j is the exact probability
that the policy writes the true answer line ("#015" and EOS) right after
step j, exp of the sum of its token log-probs, read by one forward pass per
step prefix (the answer probe); J_{-1} after the bare question; the last
step's J is the response's own outcome.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      source="model", model="head", alpha=0.5, reference="previous",
      j="scores")
  if arg.j not in ("scores", "forced"):
    raise config_lib.ConfigError(
        f"j: {arg.j!r}; use scores (the step scores of `source`) or forced "
        "(the probability of answering right after each step).")
  config = config_lib.base_config()
  # A forced-answer J reads no step scores: no labels or prm stage.
  source = "oracle" if arg.j == "forced" else arg.source
  config_presets.use_step_scores(config, source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target="soft")
  config.rl.mrt.j = arg.j
  if source == "model":
    config.prm.value_weight = 1.0  # J before the first step is V(question).
  config.rl.method = "mrt"
  config.rl.advantage_estimator = "drgrpo"
  config.rl.mrt.alpha = arg.alpha
  config.rl.mrt.reference = arg.reference
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """The bonus weight alpha, and the reference of the progress."""
  return [{"rl.mrt.alpha": alpha, "rl.mrt.reference": reference}
          for alpha in (0.25, 0.5, 1.0) for reference in ("previous", "prompt")]
