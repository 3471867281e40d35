"""Runs one experiment from a config file.

    python -m experiments.train                                  # defaults
    python -m experiments.train --config=configs/default.py --workdir=runs/x \
        --config.rl.steps=200

The workdir receives config.json, metrics.jsonl, checkpoints/ and
summary.json; rerunning with the same workdir resumes from the latest
checkpoint.
"""

from absl import flags

from rl_rewards import cli
from rl_rewards.runners import pipeline
from rl_rewards.sharding import mesh as mesh_lib

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/default", "Directory for checkpoints, metrics, summary.")


def main(config, argv):
  del argv
  mesh_lib.maybe_initialize_distributed()
  pipeline.run(config, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
