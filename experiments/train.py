"""Runs one experiment from a config file.

    python -m experiments.train                                  # defaults
    python -m experiments.train --config=configs/default.py --workdir=runs/x \\
        --config.rl.steps=200

The workdir receives config.json, metrics.jsonl, checkpoints/ and
summary.json; rerunning with the same workdir resumes from the latest
checkpoint.

On several hosts, run the same command on each with `JAX_COORDINATOR_ADDRESS`
(host:port of process 0), `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` set (see
`rl_rewards/sharding/mesh.py`); `jax.distributed` is initialised before
anything touches a device, and the workdir must be on a shared file system.
"""

from absl import flags

from rl_rewards import cli
from rl_rewards.runners import pipeline
from rl_rewards.sharding import mesh as mesh_lib

_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/default",
    "Run directory (config.json, metrics.jsonl, checkpoints/, summary.json); "
    "rerunning with the same workdir resumes the run.")


def main(config, argv):
  del argv
  mesh_lib.maybe_initialize_distributed()
  pipeline.run(config, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
