"""Compares RL methods over seeds at equal samples and compute.

    python -m experiments.compare --regime=long_sparse \\
        --methods=grpo,rloo,ppo,pav,pav_gen,oracle,pure,pure_min,oracle_pure,\\
oracle_pure_min,prime,tp_grpo,clip_delta,sft_continue --seeds=3
    python -m experiments.compare --regime=long_sparse \\
        --methods=grpo,oracle,pav --seeds=5        # seeds 0-2 are reused

For every seed, one SFT policy is trained in the regime
(`<workdir>/seed<s>/sft`, or taken from `--sft_root`) and, for methods that
need one, one set of Monte-Carlo labels (`<workdir>/seed<s>/labels`) and the
verifiers trained on it (`VERIFIERS`); every method then runs from that
shared policy (`<workdir>/seed<s>/<method>`) with the same number of RL
steps, prompts and samples per prompt, so all methods see the same number
of samples. `sft_continue` trains SFT on for the wall time of the seed's
baseline run. Finished runs are reused, so the command can be interrupted
and rerun, and more seeds or methods added later.

Outputs in `<workdir>`: `compare.md` (held-out accuracy, and per seed the
samples and the compute each method needs to reach the baseline's final
accuracy of that seed, as a fraction of the baseline's, with a bootstrap
confidence interval over seeds), `compare.json`, and `compare.png`
(accuracy against samples and against compute, which counts the labels
and verifier training a method needs; mean and spread over seeds);
`--plot=docs/compare_<regime>.png` copies the plot.
"""

import os
import shutil
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports

# label -> (config file in configs/, its argument, extra overrides, verifier).
# A label that is not here runs configs/<label>.py as it is.
METHODS = {
    "grpo": ("grpo", "", (), None),
    "drgrpo": ("drgrpo", "", (), None),
    "rloo": ("rloo", "", (), None),
    "reinforce_pp": ("reinforce_pp", "", (), None),
    "ppo": ("ppo", "", (), None),
    "pav": ("pav", "", (), "pav_head"),
    "pav_gen": ("pav", "verifier=generative", (), "pav_gen"),
    "pav_refresh": ("pav", "refresh=0.0001", (), "pav_head"),
    "oracle": ("oracle", "", (), None),
    "pure": ("pure", "", (), "step"),
    "pure_min": ("pure", "credit=min", (), "step"),
    "oracle_pure": ("oracle", "method=pure", (), None),
    "oracle_pure_min": ("oracle", "method=pure", ("rl.pure_credit=min",),
                        None),
    "prime": ("prime", "", (), None),
    "tp_grpo": ("tp_grpo", "", (), "step"),
    "clip_delta": ("clip_delta", "", (), "step"),
}
# Verifiers shared by the methods of a seed, all trained on its one label
# set: name -> (config that trains it, its argument, directory).
VERIFIERS = {
    "pav_head": ("pav", "", "prm_soft"),        # score head on soft Q-hat
    "pav_gen": ("pav", "verifier=generative", "prm_soft_gen"),  # LM head
    "step": ("pure", "", "prm_step"),  # generative, progress labels
}

_METHODS = flags.DEFINE_list(
    "methods", ["grpo", "pav", "pure", "prime", "ppo", "oracle"],
    f"Methods to compare: {', '.join(METHODS)}, any config in configs/, and "
    "sft_continue (the SFT-continued baseline).")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Number of seeds (0..seeds-1).")
_REGIME = flags.DEFINE_string(
    "regime", "standard",
    f"Regime of the task: {', '.join(config_lib.REGIMES)}.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "Root directory (default runs/compare_<regime>).")
_SFT_ROOT = flags.DEFINE_string(
    "sft_root", "", "Take each seed's SFT policy from <sft_root>/seed<s>/sft "
    "(another comparison's) instead of training one.")
_BASELINE = flags.DEFINE_string(
    "baseline", "grpo", "The outcome-only method others are measured against.")
_SIZE = flags.DEFINE_string("size", "tiny", "Model/task size: tiny or test.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every_steps", 5, "Held-out evaluation interval of the RL runs: the "
    "resolution of 'samples to reach'.")
_PLOT = flags.DEFINE_string("plot", "", "Also copy compare.png here.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value overrides for every run (SFT, PRM and "
    "methods).")


def _train(config_spec, workdir, overrides=()):
  """Runs (or resumes) one run; a finished one (its summary.json is written
  last) is reused as it is, so its recorded stage times stay its own."""
  if os.path.exists(os.path.join(workdir, metrics_lib.SUMMARY_FILE)):
    print(f"  reusing {workdir}", flush=True)
    return
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


def method_spec(label):
  """(config, argument, overrides, verifier) of a method label."""
  if label in METHODS:
    return METHODS[label]
  if not os.path.exists(os.path.join("configs", f"{label}.py")):
    raise ValueError(f"--methods: unknown method {label!r}; one of "
                     f"{', '.join(METHODS)}, sft_continue, or a config file "
                     "in configs/.")
  return label, "", (), None


def _spec(config, arg, common):
  return f"configs/{config}.py:{','.join(a for a in (common, arg) if a)}"


def fixed_costs(methods):
  """{method: [(directory, stage)]}: the shared stages each method needs
  besides its own RL run (labels and verifier training), whose seconds the
  compute axis counts."""
  costs = {}
  for label in methods:
    if label == "sft_continue":
      continue
    verifier = method_spec(label)[3]
    if verifier is not None:
      costs[label] = [("labels", "labels"), (VERIFIERS[verifier][2], "prm")]
  return costs


def run_seed(root, seed, methods, *, size, regime, overrides, eval_every,
             sft_root, baseline):
  """Runs the shared stages and every method for one seed."""
  base = os.path.join(root, f"seed{seed}")
  seed_flags = [f"seed={seed}"] + list(overrides)
  common = f"size={size},regime={regime}"
  sft_common = common  # The SFT-continued baseline starts from its own SFT.
  if sft_root:
    sft_dir = os.path.join(sft_root, f"seed{seed}", "sft")
    if not os.path.exists(os.path.join(sft_dir, "summary.json")):
      raise FileNotFoundError(f"--sft_root: no finished SFT run in {sft_dir}.")
  else:
    sft_dir = os.path.join(base, "sft")
    _train(_spec("default", "", common), sft_dir, seed_flags + ["stages=sft"])
  common += f",sft={sft_dir}"
  label_dir = os.path.join(base, "labels")
  for label in methods:
    if label == "sft_continue":
      continue
    config, arg, extra, verifier = method_spec(label)
    spec_arg = arg
    if verifier is not None:
      _train(_spec("pav", "", common), label_dir,
             seed_flags + ["stages=sft,labels"])
      trainer, trainer_arg, name = VERIFIERS[verifier]
      prm_dir = os.path.join(base, name)
      _train(_spec(trainer, ",".join(a for a in (trainer_arg,
                                                  f"labels={label_dir}") if a),
                   common), prm_dir, seed_flags + ["stages=sft,labels,prm"])
      spec_arg = ",".join(a for a in (arg, f"prm={prm_dir}") if a)
    _train(_spec(config, spec_arg, common), os.path.join(base, label),
           seed_flags + list(extra) + [f"rl.eval_every_steps={eval_every}"])
  if "sft_continue" in methods:
    summary = metrics_lib.read_json(
        os.path.join(base, baseline, "summary.json"))
    _train(_spec("default", "", sft_common),
           os.path.join(base, "sft_continue"),
           seed_flags + [f"sft.init_from={sft_dir}", "stages=sft,sft_continue",
                         "sft.continue_seconds="
                         f"{summary['stages']['rl']['rl/seconds']}"])


def main(argv):
  del argv
  regime = _REGIME.value
  if regime not in config_lib.REGIMES:
    raise app.UsageError(f"--regime: one of {', '.join(config_lib.REGIMES)}.")
  root = _WORKDIR.value or os.path.join("runs", f"compare_{regime}")
  methods = list(_METHODS.value)
  for label in methods:
    if label != "sft_continue":
      method_spec(label)
  if _BASELINE.value not in methods:
    methods.insert(0, _BASELINE.value)
  # The baseline first: sft_continue's budget is its wall time.
  methods.sort(key=lambda m: (m != _BASELINE.value, m == "sft_continue"))
  for seed in range(_SEEDS.value):
    print(f"seed {seed}:", flush=True)
    run_seed(root, seed, methods, size=_SIZE.value, regime=regime,
             overrides=_OVERRIDES.value, eval_every=_EVAL_EVERY.value,
             sft_root=_SFT_ROOT.value, baseline=_BASELINE.value)
  results = reports.summarize_comparison(
      root, methods, _SEEDS.value, _BASELINE.value,
      fixed_costs=fixed_costs(methods))
  table = reports.comparison_table(results, _BASELINE.value)
  signal = reports.diagnostics(root, methods, _SEEDS.value)
  regime_rows = reports.regime_statistics(root, _SEEDS.value, _BASELINE.value,
                                          _SFT_ROOT.value)
  title = f"regime {regime}: {config_lib.REGIMES[regime]}"
  with open(os.path.join(root, "compare.md"), "w") as f:
    f.write(f"{title}\n\n{reports.regime_table(regime_rows, _BASELINE.value)}"
            f"\n\n{table}\n\nWhere the signal is (means over every RL step "
            f"and seed):\n\n{reports.diagnostics_table(signal)}\n")
  plot = os.path.join(root, "compare.png")
  reports.plot_comparison(results, plot, title=title)
  metrics_lib.write_json_atomic(
      os.path.join(root, "compare.json"),
      {"regime": {"name": regime, "seeds": regime_rows}, "methods": results,
       "diagnostics": signal})
  if _PLOT.value:
    shutil.copyfile(plot, _PLOT.value)
  print(table)


if __name__ == "__main__":
  app.run(main)
