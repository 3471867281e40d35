"""The default job: the PAV pipeline on the arithmetic task, on CPU.

    python -m experiments.train                       # this config, runs/default
    python -m experiments.train --config=configs/default.py --workdir=runs/x \\
        --config.rl.steps=100 --config.seed=1

It is `configs/pav.py` (see there for the method and its arguments):
SFT warm start of a tiny Qwen2-style policy (~0.4 M parameters) until a
held-out gate reaches the target accuracy -> Monte-Carlo step labels from
prover rollouts -> a process advantage verifier trained on them -> RL with
the PAV effective reward (32 prompts x 8 samples per step, PPO-clip) ->
held-out evaluation. On 2 CPU cores it finishes in under 10 minutes and
prints accuracy after SFT and after RL, the verifier's quality and where
the time went. Every stage is cached in the workdir, so a later run reuses
it: `--config=configs/pure.py:sft=runs/default,labels=runs/default`.
`--config=configs/default.py:size=test` shrinks everything for smoke tests.

Follow it live: `tensorboard --logdir runs/default/tensorboard` (every
metric, tagged `<stage>/<metric>` against the stage's step; a resumed run
shows each step once), `--config.logging.wandb_project=NAME` to log it to
Weights & Biases as well (`pip install -e '.[wandb]'`), and
`python -m experiments.plot --workdir=runs/default` for its curves as a PNG
(`docs/default_job.png`). Labels and evaluations show progress with an ETA.
See `config.logging` in `rl_rewards/config_lib.py`.
"""

import os

from rl_rewards import cli

_PAV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pav.py")


def get_config(arg=None):
  return cli.load_config_file(f"{_PAV}:{arg}" if arg else _PAV)
