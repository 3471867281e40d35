"""PURE: min-form credit assignment with a PRM (Cheng et al., 2504.15275).

    python -m experiments.train --config=configs/pure.py --workdir=runs/pure
    python -m experiments.train --config=configs/pure.py:vr=0 \\
        --workdir=runs/pure_prm_only             # PRM reward only, no VR
    python -m experiments.train --config=configs/pure.py:sft=runs/pav \\
        --workdir=runs/pure_s                    # reuse an SFT policy

Stages: sft -> labels -> prm -> rl (each reusable from another workdir with
`sft=`, `labels=`, `prm=`). The PRM is by default the policy fine-tuned as a
generative step verifier on progress labels (step k negative when Q-hat
drops below half its previous value; configs/prm.py shows it is the best
verifier here), `model=head,target=hard` is a score head on Math-Shepherd
labels (1[some continuation of the prefix is correct]).
Its step rewards 2p - 1 are turned into min-form returns by the softmin
transform (temperature `rl.pure.temperature`, default 0.1), or by the hard
min-form with `credit=min` (G_k = min over later steps) or `credit=min_paper`
(the same up to the first minimum, 0 after it), with the
token-level RLOO baseline of PURE; `vr=1` adds the verifiable outcome
reward (PURE-PRM+VR, the paper's recommended setting), `vr=0` is
PURE-PRM, which the paper found prone to reward hacking: watch
`prm/min_step_position`, `steps/per_response` and `steps/empty_fraction`.
"""

from rl_rewards import config_lib
from rl_rewards import config_presets


def get_config(arg=None):
  arg = config_lib.parse_arg(
      arg, size="tiny", regime="standard", sft="", labels="", prm="",
      model="generative", target="progress",
      vr=1.0, temperature=0.1, credit="softmin")
  config = config_lib.base_config()
  config_presets.use_trained_prm(config, sft=arg.sft, labels=arg.labels,
                                 prm=arg.prm, model=arg.model,
                                 target=arg.target)
  config.rl.method = "pure"
  config.rl.pure.verifiable_reward_coef = arg.vr
  config.rl.pure.temperature = arg.temperature
  config.rl.pure.credit = arg.credit
  return config_presets.apply_size(config, arg.size, regime=arg.regime)


def get_sweep():
  """With and without the verifiable reward; softmin or hard min-form."""
  return ([{"rl.pure.verifiable_reward_coef": vr, "rl.pure.temperature": t}
           for vr in (0.0, 1.0) for t in (0.1, 1.0)] +
          [{"rl.pure.credit": credit} for credit in ("min", "min_paper")])
