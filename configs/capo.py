"""CAPO: token-level penalties on the steps a critic marks wrong.

    python -m experiments.train --config=configs/capo.py --workdir=runs/capo
    python -m experiments.train --config=configs/capo.py:source=oracle \\
        --workdir=runs/capo_oracle               # the step checker as critic

Stages: sft -> labels -> prm -> rl (each reusable with `sft=`, `labels=`,
`prm=`; `source=oracle` runs sft -> rl). The critic is by default the
policy fine-tuned as a generative step verifier on progress labels,
standing in for CAPO's LLM-as-GenPRM: one critique per response, a step is
wrong when it scores below `threshold`. Every token gets w_whole times the
group advantage of the outcome, and the tokens of a wrong step lose
w_process (w_process < w_whole keeps a correct response with a wrong step
above an incorrect one; rl_rewards/runners/methods/capo.py). Watch
`train/process_blames_first_error` against the step checker.
`critiques=C` (C > 1) samples C critiques from the verifier per response and
combines them by `voting=majority|intersection|average`, as the paper
votes over several GenPRM critiques:

    python -m experiments.train --config=configs/capo.py:critiques=5 \
        --workdir=runs/capo_vote5
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      source="model", model="generative", target="progress",
      w_whole=2.0, w_process=1.0, threshold=0.5, critiques=1,
      voting="majority")
  config = config_lib.base_config()
  config_presets.use_step_scores(config, arg.source, sft=arg.sft,
                                 labels=arg.labels, prm=arg.prm,
                                 model=arg.model, target=arg.target)
  config.rl.method = "capo"
  config.rl.capo.w_whole = arg.w_whole
  config.rl.capo.w_process = arg.w_process
  config.rl.capo.threshold = arg.threshold
  config.rl.capo.critiques = arg.critiques
  config.rl.capo.voting = arg.voting
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """The wrong-step penalty against the outcome weight 2."""
  return [{"rl.capo.w_process": w} for w in (0.5, 1.0, 1.5)]
