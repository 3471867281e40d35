"""Compares RL methods over seeds at equal samples: a table and a plot.

    python -m experiments.compare --methods=grpo,pav,pure,prime,ppo,oracle \\
        --seeds=3 --workdir=runs/compare

For every seed, one SFT policy is trained (`<workdir>/seed<s>/sft`) and, for
methods that need one, one set of Monte-Carlo labels and trained PRM/PAV
(`<workdir>/seed<s>/prm_<kind>`); every method then runs from that shared
policy (`<workdir>/seed<s>/<method>`) with the same number of RL steps,
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
import numpy as np

from rl_rewards import metrics as metrics_lib

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
    "override", [], "Extra key=value overrides for every RL run.")

# Methods whose config trains a PRM first, and the PRM config they share.
_PRM_CONFIG = {"pav": "pav", "pure": "prm", "clip_delta": "prm"}


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
  _train(f"configs/default.py:size={size}", sft_dir,
         seed_flags + ["stages=sft"])
  rl_seconds = None
  for method in methods:
    if method == "sft_continue":
      continue
    workdir = os.path.join(base, method)
    extra = list(seed_flags) + list(overrides)
    spec = f"configs/{method}.py:size={size},sft={sft_dir}"
    if method in _PRM_CONFIG:
      prm_dir = os.path.join(base, f"prm_{_PRM_CONFIG[method]}")
      _train(f"configs/{_PRM_CONFIG[method]}.py:size={size},sft={sft_dir}",
             prm_dir, seed_flags + ["stages=sft,labels,prm"])
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


def curves(workdir, method):
  """(samples, seconds, accuracy) arrays of a run's held-out evaluations."""
  stage = "sft_continue" if method == "sft_continue" else "rl"
  samples, seconds, accuracy = [], [], []
  elapsed = 0.0
  for record in metrics_lib.read_metrics(workdir):
    if record.get("stage") != stage:
      continue
    if stage == "rl":
      elapsed += record.get("time/step_s", 0.0)
    else:
      elapsed = record.get("seconds", elapsed)
    if "eval/accuracy" in record:
      samples.append(record.get("samples", 0))
      seconds.append(elapsed)
      accuracy.append(record["eval/accuracy"])
  return np.array(samples), np.array(seconds), np.array(accuracy)


def samples_to_reach(samples, accuracy, target):
  """First sample count at which the mean curve reaches `target` (or None)."""
  hits = np.nonzero(accuracy >= target - 1e-9)[0]
  return None if not hits.size else int(samples[hits[0]])


def summarize(root, methods, seeds, baseline):
  results = {}
  for method in methods:
    runs = [curves(os.path.join(root, f"seed{s}", method), method)
            for s in range(seeds)]
    runs = [r for r in runs if r[2].size]
    if not runs:
      continue
    length = min(r[2].size for r in runs)
    samples = runs[0][0][:length]
    acc = np.stack([r[2][:length] for r in runs])
    secs = np.stack([r[1][:length] for r in runs])
    results[method] = {"samples": samples.tolist(),
                       "seconds": secs.mean(0).tolist(),
                       "accuracy_mean": acc.mean(0).tolist(),
                       "accuracy_std": acc.std(0).tolist(),
                       "final": acc[:, -1].tolist(), "seeds": len(runs)}
  if baseline in results:
    target = results[baseline]["accuracy_mean"][-1]
    base_samples = samples_to_reach(
        np.array(results[baseline]["samples"]),
        np.array(results[baseline]["accuracy_mean"]), target)
    for method, r in results.items():
      if method == "sft_continue":
        continue
      reach = samples_to_reach(np.array(r["samples"]),
                               np.array(r["accuracy_mean"]), target)
      r["samples_to_baseline_final"] = reach
      r["sample_ratio"] = (None if reach in (None, 0) or not base_samples
                           else base_samples / reach)
  return results


def markdown(results, baseline):
  lines = ["| method | seeds | start acc | final acc (mean ± std) | "
           f"samples to reach {baseline}'s final | {baseline} samples / "
           "method samples |", "|---|---|---|---|---|---|"]
  for method, r in results.items():
    final = np.array(r["final"])
    reach = r.get("samples_to_baseline_final")
    ratio = r.get("sample_ratio")
    lines.append(
        f"| {method} | {r['seeds']} | {r['accuracy_mean'][0]:.3f} | "
        f"{final.mean():.3f} ± {final.std():.3f} | "
        f"{'–' if reach is None else reach} | "
        f"{'–' if ratio is None else f'{ratio:.2f}×'} |")
  return "\n".join(lines)


def plot(results, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for method, r in results.items():
    mean, std = np.array(r["accuracy_mean"]), np.array(r["accuracy_std"])
    if method != "sft_continue":
      x = np.array(r["samples"])
      axes[0].plot(x, mean, label=method)
      axes[0].fill_between(x, mean - std, mean + std, alpha=0.2)
    x = np.array(r["seconds"])
    axes[1].plot(x, mean, label=method)
    axes[1].fill_between(x, mean - std, mean + std, alpha=0.2)
  axes[0].set_xlabel("RL samples")
  axes[1].set_xlabel("wall time of the stage (s)")
  for ax in axes:
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  root = _WORKDIR.value
  methods = list(_METHODS.value)
  if _BASELINE.value not in methods:
    methods.insert(0, _BASELINE.value)
  for seed in range(_SEEDS.value):
    print(f"seed {seed}:", flush=True)
    run_seed(root, seed, methods, _SIZE.value, _OVERRIDES.value)
  results = summarize(root, methods, _SEEDS.value, _BASELINE.value)
  table = markdown(results, _BASELINE.value)
  with open(os.path.join(root, "compare.md"), "w") as f:
    f.write(table + "\n")
  metrics_lib.write_json_atomic(os.path.join(root, "compare.json"), results)
  plot(results, os.path.join(root, "compare.png"))
  print(table)
  print(json.dumps({m: r.get("sample_ratio") for m, r in results.items()}))


if __name__ == "__main__":
  app.run(main)
