"""Clip / Delta refined PRM rewards (Gao et al., 2410.15115).

    python -m experiments.train --config=configs/clip_delta.py \\
        --workdir=runs/clip_delta
    python -m experiments.train --config=configs/clip_delta.py:mode=clip \\
        --workdir=runs/clip                      # Clip only (or mode=delta)

Stages: sft -> labels -> prm -> rl, each reusable with `sft=`, `labels=`,
`prm=`. The PRM (by default the policy fine-tuned as a generative step
verifier on progress labels, as in configs/prm.py; `model=head,target=hard`
for a score head on Math-Shepherd labels) gives step rewards
r_k; Clip bounds them above, r_k <- min(r_k - eta, 0), so a long solution
cannot farm reward by adding steps; Delta replaces r_k by r_k - r_{k+1},
so the return from step k telescopes to r_k and stays bounded. Each
token of step k gets the outcome group advantage plus `rl.process_coef`
times the sum of refined rewards from step k on.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress",
      mode="clip_delta")
  config = config_lib.base_config()
  config_presets.use_trained_prm(config, sft=arg.sft, labels=arg.labels,
                                 prm=arg.prm, model=arg.model,
                                 target=arg.target)
  config.rl.method = "clip_delta"
  config.rl.clip_delta.mode = arg.mode
  config.rl.clip_delta.eta = 0.5
  config.rl.process_coef = 1.0
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  return [{"rl.clip_delta.mode": mode} for mode in ("clip", "delta",
                                                    "clip_delta")]
