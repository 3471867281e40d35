"""Plans a run's memory before launching it: what each program needs per device.

    python -m experiments.plan --config=configs/qwen_gsm8k.py \\
        --config.model.hf_path=/path/to/Qwen2.5-1.5B --devices=8 \\
        --device_memory_gb=16,95 --config.mesh.fsdp=-1

Compiles every jitted program of the configured pipeline ahead of time for
`--devices` fake CPU devices with the config's mesh (and `--config.mesh.*`,
`--config.model.*` overrides); no weights are materialised, so a 7B plan runs
on a laptop. `--config.model.hf_path` may name a directory holding only a
Hugging Face `config.json`. Prints one row per program with its per-device
GiB (parameters, optimizer state, inputs, activations, KV cache, total) and,
for each `--device_memory_gb` (GiB per device, comma-separated), whether it
fits and the largest global batch (rows) that would. Exits with an error
naming every program that does not fit the first memory given. With
`--out`, also writes the table as JSON.

A multi-turn task (`configs/multiturn.py`) rolls out episodes, so its plan
holds the episode's programs in place of `rl/rollout`:
`rl/episode_prefill` (the prompts into a new KV cache), `rl/episode_turn`
(one policy turn decoded from the cache), `rl/episode_repack` (the cache
repacked between turns) and `rl/episode_observation` (an observation
appended to the cache), each at its largest cache.
"""

import json
import os
import sys

from absl import flags

from rl_rewards import cli

_DEVICES = flags.DEFINE_integer("devices", 8, "Number of (fake) devices.")
_MEMORY = flags.DEFINE_string(
    "device_memory_gb", "80",
    "Per-device memory in GiB; comma-separated to compare several.")
_LARGEST = flags.DEFINE_boolean(
    "largest_batch", True,
    "Compile each program twice to find the largest batch that fits.")
_OUT = flags.DEFINE_string("out", "", "Optional JSON output path.")
_ONLY = flags.DEFINE_string(
    "only", "", "Comma-separated program names to plan (default: all), e.g. "
    "rl/policy_update,rl/rollout.")


def main(config, argv):
  del argv
  # Fake devices: must be set before JAX starts its backend.
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", _DEVICES.value)
  from rl_rewards.runners import pipeline  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  memories = [float(x) for x in _MEMORY.value.split(",") if x.strip()]
  model_config, mesh, rules = pipeline.plan_context(config)
  print(f"plan: {model_config.num_layers} layers, hidden "
        f"{model_config.hidden_size}, vocab {model_config.vocab_size}, "
        f"dtype {model_config.dtype}; mesh {dict(mesh.shape)} "
        f"({_DEVICES.value} devices)", flush=True)
  with mesh_lib.activate(mesh, rules):
    builders = plan_lib.pipeline_programs(config, model_config, mesh)
    if _ONLY.value:
      wanted = [n.strip() for n in _ONLY.value.split(",") if n.strip()]
      unknown = sorted(set(wanted) - {b.name for b in builders})
      if unknown:
        print(f"plan: --only names unknown programs {unknown}; this "
              f"pipeline has {[b.name for b in builders]}", file=sys.stderr)
        sys.exit(2)
      builders = [b for b in builders if b.name in wanted]
    reports = plan_lib.plan(builders, largest_batch=_LARGEST.value,
                            progress=lambda line: print("  " + line,
                                                        flush=True))
  print(plan_lib.format_table(reports, builders, memories))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"devices": _DEVICES.value, "mesh": dict(mesh.shape),
                 "device_memory_gb": memories,
                 "programs": [vars(r) for r in reports]}, f, indent=1)
  try:
    plan_lib.check_fits(reports, memories[0])
  except ValueError as e:
    print(f"plan: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
