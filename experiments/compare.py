"""Compares RL methods over seeds at equal samples and compute.

    python -m experiments.compare --regime=long_sparse \\
        --methods=grpo,rloo,ppo,pav,pav_gen,oracle,pure,pure_min,oracle_pure,\\
oracle_pure_min,prime,tp_grpo,clip_delta,sft_continue --seeds=3
    python -m experiments.compare --regime=long_sparse \\
        --methods=grpo,oracle,pav --seeds=5        # seeds 0-2 are reused
    python -m experiments.compare --regime=standard --jobs=4  # 4 at once
    python -m experiments.compare --task=multiturn \\
        --methods=grpo,igpo,spa_rl,gra,oracle_pav,oracle --seeds=3

For every seed, one SFT policy is trained in the regime
(`<workdir>/seed<s>/sft`, or taken from `--sft_root`) and, for methods that
need one, one set of Monte-Carlo labels (`<workdir>/seed<s>/labels`) and the
verifiers trained on it (`VERIFIERS`); every method then runs from that
shared policy (`<workdir>/seed<s>/<method>`) with the same number of RL
steps, prompts and samples per prompt, so all methods see the same number
of samples. `sft_continue` trains SFT on for the wall time of the seed's
baseline run. Finished runs are reused, so the command can be interrupted
and rerun, and more seeds or methods added later. `--jobs=N` runs N at
once, each after the runs it needs (`run_all`).

Outputs in `<workdir>`: `compare.md` (held-out accuracy, and per seed the
samples and the compute each method needs to reach the baseline's final
accuracy of that seed, or with `--target_evals=N` the mean of its last N
evaluations, as a fraction of the baseline's, with a bootstrap
confidence interval over seeds), `compare.json`, and `compare.png`
(accuracy against samples and against compute, which counts the labels
and verifier training a method needs; mean and spread over seeds);
`--plot=docs/compare_<regime>.png` copies the plot.

`--task=multiturn` compares the turn-level methods on the multi-turn
hidden-operands task instead (`MULTITURN_METHODS`; SFT with
`configs/multiturn.py`, default workdir `runs/compare_multiturn_<regime>`):
the same seeds, samples, evaluation and report, with turns as steps. When a run fails, the
command ends with a table of the failed runs (workdir, exit status, the
last error line of its `compare_log.txt`) and exits with status 1.
"""

from concurrent import futures
import dataclasses
import os
import shutil
import subprocess
import sys

from absl import app
from absl import flags

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import config_presets
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
    "oracle_pure_min": ("oracle", "method=pure", ("rl.pure.credit=min",),
                        None),
    "prime": ("prime", "", (), None),
    "tp_grpo": ("tp_grpo", "", (), "step"),
    "clip_delta": ("clip_delta", "", (), "step"),
    "prof": ("prof", "", (), "step"),
    "posterior_grpo": ("posterior_grpo", "", (), "step"),
    "trust_grpo": ("trust_grpo", "", (), "step"),
    "ppo_prm": ("ppo", "reward=prm", (), "step"),
    "oracle_prof": ("prof", "source=oracle", (), None),
    "oracle_posterior_grpo": ("posterior_grpo", "source=oracle", (), None),
    "oracle_trust_grpo": ("trust_grpo", "source=oracle", (), None),
    "oracle_ppo_prm": ("ppo", "reward=prm,source=oracle", (), None),
    "fapo": ("fapo", "", (), "step"),
    "capo": ("capo", "", (), "step"),
    "mrt": ("mrt", "", (), "pav_head"),
    "oracle_fapo": ("fapo", "source=oracle", (), None),
    "oracle_capo": ("capo", "source=oracle", (), None),
    "oracle_mrt": ("mrt", "source=oracle", (), None),
}
# The same for the multi-turn hidden-operands task (`--task=multiturn`):
# label -> (config, argument, overrides, verifier).
MULTITURN_METHODS = {
    "grpo": ("multiturn", "method=grpo", (), None),
    "oracle": ("multiturn", "method=oracle", (), None),
    "oracle_pav": ("multiturn", "method=pav", (), None),
    "oracle_pure": ("multiturn", "method=pure", (), None),
    "gra": ("gra", "", (), None),
    "igpo": ("igpo", "", (), None),
    "spa_rl": ("spa_rl", "", (), None),
    "pav": ("multiturn", "method=pav,source=model", (), "turn_pav"),
    "pure": ("multiturn", "method=pure,source=model", (), "turn_step"),
}
# The config each task's SFT policies (and the SFT-continued baseline) run.
SFT_CONFIGS = {"arith": "default", "multiturn": "multiturn"}
# Verifiers shared by the methods of a seed, all trained on its one label
# set: name -> (config that trains it, its argument, directory).
VERIFIERS = {
    "pav_head": ("pav", "", "prm_soft"),        # score head on soft Q-hat
    "pav_gen": ("pav", "verifier=generative", "prm_soft_gen"),  # LM head
    "step": ("pure", "", "prm_step"),  # generative, progress labels
    # On episodes (`--task=multiturn`): per-turn labels from prover episodes.
    "turn_pav": ("multiturn", "method=pav,source=model", "prm_turn_soft"),
    "turn_step": ("multiturn", "method=pure,source=model", "prm_turn_step"),
}
# The config (and argument) whose labels stage makes each task's label set.
LABELS_CONFIGS = {"arith": ("pav", ""),
                  "multiturn": ("multiturn", "method=pav,source=model")}

_METHODS = flags.DEFINE_list(
    "methods", ["grpo", "pav", "pure", "prime", "ppo", "oracle"],
    f"Methods to compare: {', '.join(METHODS)}, any config in configs/, and "
    "sft_continue (the SFT-continued baseline).")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Number of seeds (0..seeds-1).")
_REGIME = flags.DEFINE_string(
    "regime", "standard",
    f"Regime of the task: {', '.join(config_presets.REGIMES)}.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "Root directory (default runs/compare_<regime>).")
_SFT_ROOT = flags.DEFINE_string(
    "sft_root", "", "Take each seed's SFT policy from <sft_root>/seed<s>/sft "
    "(another comparison's) instead of training one.")
_BASELINE = flags.DEFINE_string(
    "baseline", "grpo", "The outcome-only method others are measured against.")
_TASK = flags.DEFINE_enum(
    "task", "arith", list(SFT_CONFIGS),
    "arith: the single-turn arithmetic task (METHODS); multiturn: the "
    "hidden-operands episodes (MULTITURN_METHODS).")
_SIZE = flags.DEFINE_string("size", "tiny", "Model/task size: tiny or test.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every_steps", 5, "Held-out evaluation interval of the RL runs: the "
    "resolution of 'samples to reach'.")
_TARGET_EVALS = flags.DEFINE_integer(
    "target_evals", 1, "The target of 'samples to reach' on a seed: the mean "
    "of the baseline's last N held-out evaluations there (1: its final "
    "accuracy). N > 1 keeps a baseline that ends on a dip from lowering it.")
_PLOT = flags.DEFINE_string("plot", "", "Also copy compare.png here.")
_JOBS = flags.DEFINE_integer(
    "jobs", 1, "Runs at once, each started when the runs it needs have "
    "finished. Runs that share cores take longer, and the compute axis counts "
    "their seconds: compare methods whose runs had the same number of "
    "neighbours.")
_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra key=value overrides for every run (SFT, PRM and "
    "methods).")


@dataclasses.dataclass(frozen=True)
class Run:
  """One `experiments.train` run of a comparison.

  Attributes:
    workdir: its directory; a finished run (summary.json is written last) is
      reused as it is, so its recorded stage times stay its own.
    config_spec: `configs/<name>.py:<argument>`.
    overrides: `key=value` config overrides.
    needs: directories of the runs that must finish before it starts.
    budget_from: for an SFT-continued run, the directory of the run whose RL
      seconds are its training budget (read when it starts).
  """
  workdir: str
  config_spec: str
  overrides: tuple[str, ...] = ()
  needs: tuple[str, ...] = ()
  budget_from: str = ""


def _finished(workdir):
  return os.path.exists(os.path.join(workdir, metrics_lib.SUMMARY_FILE))


LOG_FILE = "compare_log.txt"  # Each run's output, in its workdir.


class RunFailed(RuntimeError):
  """A run of the comparison exited with a non-zero status."""

  def __init__(self, workdir: str, status: int, last_line: str):
    super().__init__(f"{workdir}: run failed (exit {status}); see "
                     f"{os.path.join(workdir, LOG_FILE)}")
    self.workdir, self.status, self.last_line = workdir, status, last_line


class RunsFailed(RuntimeError):
  """Runs of the comparison failed: `failures` is [(workdir, error)]."""

  def __init__(self, failures):
    super().__init__("; ".join(str(e) for _, e in failures))
    self.failures = failures

  def table(self) -> str:
    """The failures as `cli.failure_table` rows."""
    return cli.failure_table([
        (workdir, getattr(e, "status", "–"),
         getattr(e, "last_line", None) or f"{type(e).__name__}: {e}")
        for workdir, e in self.failures])


def _train(run):
  """Runs (or resumes) one run in a subprocess; raises RunFailed if it
  fails."""
  overrides = list(run.overrides)
  if run.budget_from:
    summary = metrics_lib.read_json(
        os.path.join(run.budget_from, metrics_lib.SUMMARY_FILE))
    overrides.append(
        f"sft.continue_seconds={summary['stages']['rl']['rl/seconds']}")
  args = [sys.executable, "-m", "experiments.train",
          f"--config={run.config_spec}", f"--workdir={run.workdir}"] + [
              f"--config.{o}" for o in overrides]
  os.makedirs(run.workdir, exist_ok=True)
  # One write per line: runs started side by side print from threads.
  print(f"  {' '.join(args[2:])}\n", end="", flush=True)
  path = os.path.join(run.workdir, LOG_FILE)
  offset = os.path.getsize(path) if os.path.exists(path) else 0
  with open(path, "a") as log:
    code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode
  if code != 0:
    raise RunFailed(run.workdir, code, cli.last_error_line(path, offset))


def run_all(runs, jobs=1, train=_train):
  """Runs `runs`, at most `jobs` at a time, each once the runs it needs have
  finished, in the order given where several are ready.

  A run listed twice (a shared label set or verifier) runs once, and a
  finished one is reused. When one fails, no new run starts; the ones under
  way finish, then `RunsFailed` is raised with every failure.
  """
  pending = list({run.workdir: run for run in runs}.values())
  known = {run.workdir for run in pending}
  done = {run.workdir for run in pending if _finished(run.workdir)}
  for workdir in sorted(done):
    print(f"  reusing {workdir}", flush=True)
  pending = [run for run in pending if run.workdir not in done]
  for run in pending:
    missing = [n for n in run.needs if n not in known and not _finished(n)]
    if missing:
      raise ValueError(f"{run.workdir} needs {missing[0]}, which is neither "
                       "finished nor planned.")
    done.update(n for n in run.needs if n not in known)  # Finished before.
  failures = []
  with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    running = {}
    while pending or running:
      if not failures:
        for run in [r for r in pending if set(r.needs) <= done]:
          if len(running) == jobs:
            break
          pending.remove(run)
          running[pool.submit(train, run)] = run
      if not running:
        break
      finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
      for future in finished:
        run = running.pop(future)
        if future.exception() is not None:
          failures.append((run.workdir, future.exception()))
        else:
          done.add(run.workdir)
  if failures:
    raise RunsFailed(failures)
  if pending:
    raise ValueError("runs left that can never start: "
                     f"{', '.join(r.workdir for r in pending)}.")


def method_spec(label, task="arith"):
  """(config, argument, overrides, verifier) of a method label of `task`."""
  table = MULTITURN_METHODS if task == "multiturn" else METHODS
  if label in table:
    return table[label]
  if not os.path.exists(os.path.join("configs", f"{label}.py")):
    raise config_lib.ConfigError(
        f"--methods: unknown method {label!r}; one of {', '.join(table)}, "
        "sft_continue, or a config file in configs/.")
  return label, "", (), None


def _spec(config, arg, common):
  return f"configs/{config}.py:{','.join(a for a in (common, arg) if a)}"


def fixed_costs(methods, task="arith"):
  """{method: [(directory, stage)]}: the shared stages each method needs
  besides its own RL run (labels and verifier training), whose seconds the
  compute axis counts."""
  costs = {}
  for label in methods:
    if label == "sft_continue":
      continue
    verifier = method_spec(label, task)[3]
    if verifier is not None:
      costs[label] = [("labels", "labels"), (VERIFIERS[verifier][2], "prm")]
  return costs


def verifier_dirs(methods, task="arith"):
  """The verifier directories of a seed that `methods` train, in
  `VERIFIERS` order."""
  used = {method_spec(m, task)[3] for m in methods if m != "sft_continue"}
  return [d for name, (_, _, d) in VERIFIERS.items() if name in used]


def plan_seed(root, seed, methods, *, size, regime, overrides, eval_every,
              sft_root, baseline, task="arith"):
  """[Run]: the shared stages and every method of one seed, each after the
  runs it needs (its SFT policy, label set and verifier)."""
  base = os.path.join(root, f"seed{seed}")
  seed_flags = (f"seed={seed}",) + tuple(overrides)
  common = f"size={size},regime={regime}"
  sft_common = common  # The SFT-continued baseline starts from its own SFT.
  runs = []
  if sft_root:
    sft_dir = os.path.join(sft_root, f"seed{seed}", "sft")
    if not _finished(sft_dir):
      raise FileNotFoundError(f"--sft_root: no finished SFT run in {sft_dir}.")
  else:
    sft_dir = os.path.join(base, "sft")
    runs.append(Run(sft_dir, _spec(SFT_CONFIGS[task], "", common),
                    seed_flags + ("stages=sft",)))
  sft_needs = () if sft_root else (sft_dir,)
  common += f",sft={sft_dir}"
  label_dir = os.path.join(base, "labels")
  for label in methods:
    if label == "sft_continue":
      continue
    config, arg, extra, verifier = method_spec(label, task)
    spec_arg, needs = arg, sft_needs
    if verifier is not None:
      runs.append(Run(label_dir, _spec(*LABELS_CONFIGS[task], common),
                      seed_flags + ("stages=sft,labels",), sft_needs))
      trainer, trainer_arg, name = VERIFIERS[verifier]
      prm_dir = os.path.join(base, name)
      runs.append(Run(
          prm_dir,
          _spec(trainer, ",".join(a for a in (trainer_arg,
                                              f"labels={label_dir}") if a),
                common),
          seed_flags + ("stages=sft,labels,prm",), (label_dir,)))
      spec_arg = ",".join(a for a in (arg, f"prm={prm_dir}") if a)
      needs = sft_needs + (prm_dir,)
    runs.append(Run(os.path.join(base, label), _spec(config, spec_arg, common),
                    seed_flags + tuple(extra) +
                    (f"rl.eval_every_steps={eval_every}",), needs))
  if "sft_continue" in methods:
    baseline_dir = os.path.join(base, baseline)
    runs.append(Run(
        os.path.join(base, "sft_continue"),
        _spec(SFT_CONFIGS[task], "", sft_common),
        seed_flags + (f"sft.init_from={sft_dir}", "stages=sft,sft_continue"),
        sft_needs + (baseline_dir,), budget_from=baseline_dir))
  return runs


def main(argv):
  del argv
  regime = _REGIME.value
  if regime not in config_presets.REGIMES:
    raise app.UsageError(f"--regime: one of {', '.join(config_presets.REGIMES)}.")
  task = _TASK.value
  root = _WORKDIR.value or os.path.join(
      "runs", f"compare_{regime}" if task == "arith"
      else f"compare_{task}_{regime}")
  methods = list(_METHODS.value)
  for label in methods:
    if label != "sft_continue":
      method_spec(label, task)
  if _BASELINE.value not in methods:
    methods.insert(0, _BASELINE.value)
  # The baseline first: sft_continue's budget is its wall time.
  methods.sort(key=lambda m: (m != _BASELINE.value, m == "sft_continue"))
  # Method by method, every seed of one before the next, so that an
  # interrupted comparison has whole methods to report.
  runs = []
  for label in methods:
    for seed in range(_SEEDS.value):
      runs += plan_seed(root, seed, [label], size=_SIZE.value, regime=regime,
                        overrides=_OVERRIDES.value,
                        eval_every=_EVAL_EVERY.value, sft_root=_SFT_ROOT.value,
                        baseline=_BASELINE.value, task=task)
  if _JOBS.value < 1:
    raise app.UsageError("--jobs: at least 1.")
  if _TARGET_EVALS.value < 1:
    raise app.UsageError("--target_evals: at least 1.")
  try:
    run_all(runs, _JOBS.value)
  except RunsFailed as e:
    print(f"\n{len(e.failures)} runs failed (the runs that need them did "
          f"not start):\n\n{e.table()}", flush=True)
    sys.exit(1)
  results = reports.summarize_comparison(
      root, methods, _SEEDS.value, _BASELINE.value,
      fixed_costs=fixed_costs(methods, task), target_evals=_TARGET_EVALS.value)
  table = reports.comparison_table(results, _BASELINE.value,
                                   _TARGET_EVALS.value)
  signal = reports.diagnostics(root, methods, _SEEDS.value)
  regime_rows = reports.regime_statistics(root, _SEEDS.value, _BASELINE.value,
                                          _SFT_ROOT.value)
  verifiers = reports.verifier_statistics(root, _SEEDS.value,
                                          verifier_dirs(methods, task))
  title = f"regime {regime}: {config_presets.REGIMES[regime]}"
  if task != "arith":
    title = f"{task} task, {title}"
  with open(os.path.join(root, "compare.md"), "w") as f:
    f.write(f"{title}\n\n{reports.regime_table(regime_rows, _BASELINE.value)}"
            f"\n\n{table}\n\nWhere the signal is (means over every RL step "
            f"and seed):\n\n{reports.diagnostics_table(signal)}\n")
    if verifiers:
      f.write("\nThe verifiers, on their label set's held-out problems, "
              "mean (seed 0, 1, ...):\n\n"
              f"{reports.verifier_table(verifiers)}\n")
  plot = os.path.join(root, "compare.png")
  reports.plot_comparison(results, plot, title=title)
  metrics_lib.write_json_atomic(
      os.path.join(root, "compare.json"),
      {"task": task, "regime": {"name": regime, "seeds": regime_rows},
       "target_evals": _TARGET_EVALS.value, "methods": results,
       "diagnostics": signal, "verifiers": verifiers})
  if _PLOT.value:
    shutil.copyfile(plot, _PLOT.value)
  print(table)


if __name__ == "__main__":
  cli.define_debug_flag()
  app.run(cli.reporting_errors(main))
