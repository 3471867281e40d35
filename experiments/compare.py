"""Compares RL methods over seeds at equal samples: a table and a plot.

    python -m experiments.compare --methods=grpo,pav,pure,prime,ppo,oracle \\
        --seeds=3 --workdir=runs/compare

For every seed, one SFT policy is trained (`<workdir>/seed<s>/sft`) and, for
methods that need one, one set of Monte-Carlo labels (`<workdir>/seed<s>/
labels`) and the verifiers trained on it (`prm_soft`: the PAV;
`prm_step`: the step verifier of PURE and Clip/Delta); every method
then runs from that shared policy (`<workdir>/seed<s>/<method>`) with the
same number of RL steps,
prompts and samples per prompt, so all methods see the same number of
samples. The SFT-continued baseline (`sft_continue`) trains SFT for the wall
time the seed's first RL method took. Finished runs are reused, so the
command can be interrupted and rerun.

Outputs in `<workdir>`: `compare.md` (held-out accuracy, mean ± std over
seeds, and the samples each method needs to reach the outcome baseline's
final accuracy), `compare.json`, and `compare.png` (accuracy against samples
and against wall time, mean and spread over seeds).
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import metrics as metrics_lib
from rl_rewards import reports

_METHODS = flags.DEFINE_list(
    "methods", ["grpo", "pav", "pure", "prime", "ppo", "oracle"],
    "Methods (config files in configs/) to compare; add sft_continue for the "
    "SFT-continued baseline.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Number of seeds (0..seeds-1).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/compare", "Root directory.")
_BASELINE = flags.DEFINE_string(
    "baseline", "grpo", "The outcome-only method others are measured against.")
_SIZE = flags.DEFINE_string("size", "tiny", "Model/task size: tiny or test.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value overrides for every run (SFT, PRM and "
    "methods).")

# Methods that score steps with a trained verifier: the config that trains
# it and the shared directory it is trained in. Every verifier of a seed is
# trained on the same Monte-Carlo label set (`<workdir>/seed<s>/labels`).
_VERIFIER = {"pav": ("pav", "prm_soft"), "pure": ("pure", "prm_step"),
             "clip_delta": ("pure", "prm_step")}


def _train(config_spec, workdir, overrides=()):
  args = [sys.executable, "-m", "experiments.train", f"--config={config_spec}",
          f"--workdir={workdir}"] + [f"--config.{o}" for o in overrides]
  os.makedirs(workdir, exist_ok=True)
  print(f"  {' '.join(args[2:])}", flush=True)
  with open(os.path.join(workdir, "compare_log.txt"), "a") as log:
    code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode
  if code != 0:
    raise RuntimeError(f"run failed (exit {code}); see "
                       f"{os.path.join(workdir, 'compare_log.txt')}")


def run_seed(root, seed, methods, size, overrides):
  """Runs the shared stages and every method for one seed."""
  base = os.path.join(root, f"seed{seed}")
  seed_flags = [f"seed={seed}"]
  sft_dir = os.path.join(base, "sft")
  seed_flags += list(overrides)
  _train(f"configs/default.py:size={size}", sft_dir,
         seed_flags + ["stages=sft"])
  rl_seconds = None
  label_dir = os.path.join(base, "labels")
  for method in methods:
    if method == "sft_continue":
      continue
    workdir = os.path.join(base, method)
    extra = list(seed_flags)
    spec = f"configs/{method}.py:size={size},sft={sft_dir}"
    if method in _VERIFIER:
      trainer, name = _VERIFIER[method]
      _train(f"configs/pav.py:size={size},sft={sft_dir}", label_dir,
             seed_flags + ["stages=sft,labels"])
      prm_dir = os.path.join(base, name)
      _train(f"configs/{trainer}.py:size={size},sft={sft_dir},"
             f"labels={label_dir}", prm_dir,
             seed_flags + ["stages=sft,labels,prm"])
      spec += f",prm={prm_dir}"
    _train(spec, workdir, extra)
    if rl_seconds is None:
      summary = metrics_lib.read_json(os.path.join(workdir, "summary.json"))
      rl_seconds = summary["stages"]["rl"]["rl/seconds"]
  if "sft_continue" in methods:
    _train(f"configs/default.py:size={size}",
           os.path.join(base, "sft_continue"),
           seed_flags + [f"sft.init_from={sft_dir}", "stages=sft,sft_continue",
                         f"sft.continue_seconds={rl_seconds or 60.0}"])


def main(argv):
  del argv
  root = _WORKDIR.value
  methods = list(_METHODS.value)
  if _BASELINE.value not in methods:
    methods.insert(0, _BASELINE.value)
  for seed in range(_SEEDS.value):
    print(f"seed {seed}:", flush=True)
    run_seed(root, seed, methods, _SIZE.value, _OVERRIDES.value)
  results = reports.summarize_comparison(root, methods, _SEEDS.value, _BASELINE.value)
  table = reports.comparison_table(results, _BASELINE.value)
  with open(os.path.join(root, "compare.md"), "w") as f:
    f.write(table + "\n")
  metrics_lib.write_json_atomic(os.path.join(root, "compare.json"), results)
  reports.plot_comparison(results, os.path.join(root, "compare.png"))
  print(table)
  print(json.dumps({m: r.get("sample_ratio") for m, r in results.items()}))


if __name__ == "__main__":
  app.run(main)
