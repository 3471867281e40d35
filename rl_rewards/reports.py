"""Reports over finished workdirs: run summaries, sweep tables and method
comparisons.

Reads `summary.json` and `metrics.jsonl` files (never writes them) and turns
them into text, markdown tables, JSON-ready dicts and PNG plots: the summary
a run prints at its end (`summary_text`), and the reports of
`experiments/sweep.py` and `experiments/compare.py`.
"""

import math
import os

import numpy as np

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib

SWEEP_COLUMNS = ("eval/accuracy", "eval/pass@8", "eval/step_accuracy")

# What the end-of-run summary shows of the stages without held-out accuracy:
# (summary key, label). Verifier quality is against the task's step checker
# where it has one (`vs checker`), on held-out problems.
_STAGE_HEADLINES = {
    "labels": (("labels/solutions", "solutions"),
               ("labels/q_auroc_vs_oracle", "Q-hat step AUROC vs checker"),
               ("labels/first_error_vs_oracle", "first error vs checker")),
    "prm": (("prm/valid_auroc_vs_oracle", "validation step AUROC vs checker"),
            ("prm/valid_f1_at_half", "first-error F1"),
            ("prm/valid_auroc_vs_labels", "step AUROC vs its labels"),
            ("prm/valid_abs_error", "|error| vs its labels"),
            ("prm/steps", "steps")),
    "prm_eval": (("prm_eval/auroc", "test step AUROC"),
                 ("prm_eval/f1", "first-error F1"),
                 ("prm_eval/bon16_min", "BoN-16 (min)"),
                 ("prm_eval/bon16_majority", "BoN-16 majority")),
}
# Per stage with a policy: (summary key, label) shown after the accuracy.
_POLICY_EXTRAS = (("sft/steps", "steps"), ("rl/steps", "steps"),
                  ("sft_continue/steps", "steps"))


def summary_text(summary) -> str:
  """The end-of-run summary a person reads, from a `summary.json` dict.

  One line per stage, with its time: held-out accuracy (and pass@k, the
  extra held-out sets' pass@1) for the stages that train the policy; the
  verifier's held-out quality for `labels`, `prm` and `prm_eval`. Then the
  RL gain (held-out accuracy after RL minus after SFT, and minus the
  SFT-continued baseline when the run has one), the updates skipped for a
  non-finite loss or gradient (when any) and the wall time.
  """
  stages = summary["stages"]
  times = summary.get("stage_time_s", {})
  lines = ["", "=== summary ==="]
  width = max([len(stage) for stage in stages] + [3])
  for stage, values in stages.items():
    text = _stage_text(stage, values)
    if stage in times:
      text += f" ({times[stage]:.0f} s)"
    lines.append(f"{stage:>{width}}: {text}")
  rl_acc = stages.get("rl", {}).get("eval/accuracy")
  for base, name in (("sft", "SFT"), ("sft_continue", "SFT continued")):
    base_acc = stages.get(base, {}).get("eval/accuracy")
    if rl_acc is not None and base_acc is not None:
      lines.append(f"RL gain over {name}: {rl_acc - base_acc:+.3f} held-out "
                   f"accuracy ({base_acc:.3f} -> {rl_acc:.3f})")
  skipped = []
  for stage, values in stages.items():
    for key, value in sorted(values.items()):
      if key.endswith("skipped_updates") and value:
        model = key.split("/")[-1][:-len("skipped_updates")].rstrip("_")
        skipped.append(f"{stage}{' ' + model if model else ''} {value}")
  if skipped:
    lines.append("updates skipped (non-finite loss or gradient): " +
                 ", ".join(skipped))
  lines.append(f"wall time {summary['wall_time_s']:.0f} s")
  return "\n".join(lines)


def _number(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _stage_text(stage, values):
  numbers = {k: v for k, v in values.items() if _number(v)}
  if "eval/accuracy" in numbers:
    parts = [f"held-out accuracy {numbers['eval/accuracy']:.3f}"]
    parts += [f"{k.split('/')[-1]} {numbers[k]:.3f}" for k in sorted(numbers)
              if k.startswith("eval/pass@")]
    parts += [f"{k[len('eval/'):]} {numbers[k]:.3f}" for k in sorted(numbers)
              if k.startswith("eval/") and k.count("/") == 2 and
              k.endswith("/pass@1")]
    parts += [f"{label} {numbers[k]}" for k, label in _POLICY_EXTRAS
              if k in numbers]
    if values.get("sft/converged") is False:
      parts.append("target accuracy not reached")
    return "; ".join(parts)
  shown = [(k, label) for k, label in _STAGE_HEADLINES.get(stage, ())
           if k in numbers]
  if not shown:  # A stage without headline numbers: its first few.
    shown = [(k, k) for k in sorted(numbers)[:6]]
  return ", ".join(f"{label} {_measured(numbers[k])}" for k, label in shown)


def _measured(value):
  # NaN: not measured (e.g. an AUROC without wrong steps to rank).
  return "n/a" if isinstance(value, float) and math.isnan(value) else (
      _fmt(value))


def collect_sweep(root, points):
  """A row per sweep point: its name, workdir (`cli.point_dirs`) and
  summary (None when it has not finished)."""
  rows = []
  for overrides, name in zip(points, cli.point_dirs(points)):
    workdir = os.path.join(root, name)
    path = os.path.join(workdir, metrics_lib.SUMMARY_FILE)
    summary = metrics_lib.read_json(path) if os.path.exists(path) else None
    rows.append({"point": cli.point_name(overrides), "workdir": workdir,
                 "summary": summary})
  return rows


# Columns of a sweep whose points stop at PRM evaluation: (header, stage,
# summary key). Test AUROC / F1 are against the task's step checker on fresh
# held-out solutions; the validation AUROC is on the label set's own
# held-out problems.
PRM_SWEEP_COLUMNS = (
    ("label problems", "prm", "prm/label_problems"),
    ("valid AUROC vs oracle", "prm", "prm/valid_auroc_vs_oracle"),
    ("step AUROC", "prm_eval", "prm_eval/auroc"),
    ("first-error F1", "prm_eval", "prm_eval/f1"),
    ("BoN-16 (min)", "prm_eval", "prm_eval/bon16_min"),
    ("BoN-16 majority", "prm_eval", "prm_eval/bon16_majority"),
)


def sweep_table(rows) -> str:
  """A markdown row per sweep point: RL accuracies, or, when no point has an
  RL stage but some have `prm_eval`, the verifier's quality."""
  stages = [set(row["summary"]["stages"]) for row in rows if row["summary"]]
  prm_only = (not any("rl" in s for s in stages) and
              any("prm_eval" in s for s in stages))
  if prm_only:
    columns = [(stage, key) for _, stage, key in PRM_SWEEP_COLUMNS]
    header = ["point"] + [name for name, _, _ in PRM_SWEEP_COLUMNS]
  else:
    columns = [("sft", "eval/accuracy")] + [("rl", c) for c in SWEEP_COLUMNS]
    header = ["point", "SFT acc"] + [f"RL {c.split('/')[1]}"
                                     for c in SWEEP_COLUMNS]
  header.append("wall s")
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for row in rows:
    summary = row["summary"]
    if summary is None:
      lines.append(f"| {row['point']} | failed |" + " |" * (len(header) - 2))
      continue
    cells = [row["point"]] + [
        _fmt(summary["stages"].get(stage, {}).get(key))
        for stage, key in columns]
    cells.append(f"{summary['wall_time_s']:.0f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _fmt(value):
  if value is None:
    return "–"
  return str(value) if isinstance(value, int) else f"{value:.3f}"


def run_curves(workdir, method):
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


def stage_seconds(workdir, stage) -> float:
  """Seconds a finished run spent in `stage` (its summary.json), else 0."""
  path = os.path.join(workdir, metrics_lib.SUMMARY_FILE)
  if not os.path.exists(path):
    return 0.0
  return float(metrics_lib.read_json(path).get("stage_time_s", {}).get(
      stage, 0.0))


def bootstrap_interval(values, *, draws=2000, level=0.95, seed=0):
  """Percentile bootstrap interval of the mean of `values` over seeds."""
  values = np.asarray(values, np.float64)
  rng = np.random.default_rng(seed)
  means = values[rng.integers(0, values.size, (draws, values.size))].mean(1)
  tail = (1 - level) / 2
  return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def reach_per_seed(curve, target, baseline_total):
  """How much of the baseline's budget a run needs to reach `target`.

  Args:
    curve: (x, accuracy) arrays of one run (x: samples or seconds).
    target: the baseline's final accuracy on the same seed.
    baseline_total: the baseline's whole budget on that seed (same unit).

  Returns:
    x at the run's first evaluation at or above `target` divided by
    `baseline_total`, or None if the run never reaches it.
  """
  x, accuracy = curve
  hit = samples_to_reach(np.asarray(x), np.asarray(accuracy), target)
  return None if hit is None else hit / max(baseline_total, 1e-9)


def _reach_summary(fractions):
  reached = [f for f in fractions if f is not None]
  out = {"per_seed": fractions, "seeds_reached": len(reached)}
  if reached and len(reached) == len(fractions):
    out["mean"] = float(np.mean(reached))
    out["worst"] = float(np.max(reached))
    out["interval"] = bootstrap_interval(reached)
  return out


def baseline_target(accuracy, evals=1) -> float:
  """The accuracy other methods must reach: the mean of the baseline's last
  `evals` held-out evaluations (1: its final one).

  With `evals` > 1 a baseline that ends on a dip does not lower the target,
  nor does one that ends on a spike raise it.
  """
  accuracy = np.asarray(accuracy, np.float64)
  if evals < 1:
    raise ValueError(f"evals: at least 1, got {evals}.")
  return float(accuracy[-evals:].mean())


def summarize_comparison(root, methods, seeds, baseline, fixed_costs=None,
                         target_evals=1):
  """Curves and samples/compute-to-reach of every method over seeds.

  Args:
    root: the comparison's directory (`seed<s>/<method>` runs; only
      finished runs, those with a summary.json, count).
    methods: method labels.
    seeds: number of seeds.
    baseline: the label whose final accuracy is the target.
    fixed_costs: {method: [(directory, stage)]}: shared stages of a seed
      (`seed<s>/<directory>`) whose seconds count toward a method's compute
      (labels, verifier training).
    target_evals: the target on a seed is the mean of the baseline's last
      `target_evals` evaluations there (`baseline_target`); 1 (the default)
      is its final accuracy.

  Returns:
    {method: {samples, seconds (compute, fixed costs included),
    accuracy_mean, accuracy_std, final, seeds, and, against the baseline,
    reach: {samples: ..., compute: ...}}}; `reach` gives per seed the
    fraction of the baseline's samples (compute) the method needs to reach
    the baseline's final accuracy of that seed (None: never), and over
    seeds their mean, worst and a bootstrap 95 % interval when every seed
    reached it.
  """
  fixed_costs = fixed_costs or {}
  results, per_seed = {}, {}
  for method in methods:
    runs = {}
    for s in range(seeds):
      workdir = os.path.join(root, f"seed{s}", method)
      if not os.path.exists(os.path.join(workdir, metrics_lib.SUMMARY_FILE)):
        continue  # Unfinished: its curve would cut every seed's short.
      samples, secs, acc = run_curves(workdir, method)
      if not acc.size:
        continue
      fixed = sum(stage_seconds(os.path.join(root, f"seed{s}", d), stage)
                  for d, stage in fixed_costs.get(method, ()))
      runs[s] = (samples, secs + fixed, acc)
    if not runs:
      continue
    per_seed[method] = runs
    length = min(r[2].size for r in runs.values())
    samples = next(iter(runs.values()))[0][:length]
    acc = np.stack([r[2][:length] for r in runs.values()])
    secs = np.stack([r[1][:length] for r in runs.values()])
    results[method] = {"samples": samples.tolist(),
                       "seconds": secs.mean(0).tolist(),
                       "accuracy_mean": acc.mean(0).tolist(),
                       "accuracy_std": acc.std(0).tolist(),
                       "final": acc[:, -1].tolist(), "seeds": len(runs),
                       "seed_ids": sorted(runs)}
  if baseline not in results:
    return results
  target = baseline_target(results[baseline]["accuracy_mean"], target_evals)
  base_samples = samples_to_reach(
      np.array(results[baseline]["samples"]),
      np.array(results[baseline]["accuracy_mean"]), target)
  base_runs = per_seed[baseline]
  for method, r in results.items():
    # SFT's samples are gold demonstrations, not policy samples: the
    # SFT-continued baseline is compared on compute only.
    axes = ("compute",) if method == "sft_continue" else ("samples",
                                                          "compute")
    if "samples" in axes:
      reach = samples_to_reach(np.array(r["samples"]),
                               np.array(r["accuracy_mean"]), target)
      r["samples_to_baseline_final"] = reach
      r["sample_ratio"] = (None if reach in (None, 0) or not base_samples
                           else base_samples / reach)
    fractions = {axis: [] for axis in axes}
    for s, (samples, secs, acc) in per_seed[method].items():
      if s not in base_runs:
        continue
      b_samples, b_secs, b_acc = base_runs[s]
      seed_target = baseline_target(b_acc, target_evals)
      if "samples" in axes:
        fractions["samples"].append(reach_per_seed(
            (samples, acc), seed_target, b_samples[-1]))
      fractions["compute"].append(reach_per_seed(
          (secs, acc), seed_target, b_secs[-1]))
    r["reach"] = {k: _reach_summary(v) for k, v in fractions.items()}
  return results


def _fraction_cell(summary):
  per_seed = " / ".join("never" if f is None else f"{f:.2f}"
                        for f in summary["per_seed"])
  if "mean" not in summary:
    return f"{per_seed} ({summary['seeds_reached']} of " \
           f"{len(summary['per_seed'])} seeds)"
  low, high = summary["interval"]
  return f"{summary['mean']:.2f} [{low:.2f}, {high:.2f}]; {per_seed}"


def comparison_table(results, baseline, target_evals=1):
  """Markdown: accuracy, and the fraction of the baseline's samples and
  compute each method needs to reach the baseline's final accuracy, or the
  mean of its last `target_evals` evaluations (per seed; mean [95 %
  bootstrap interval]; 'never' past its budget)."""
  target = (f"{baseline}'s final" if target_evals == 1 else
            f"{baseline}'s mean of its last {target_evals} evaluations")
  lines = ["| method | seeds | start acc | final acc (mean ± std) | "
           f"samples to reach {target}, as a fraction of "
           f"{baseline}'s | compute to reach it, likewise |",
           "|---|---|---|---|---|---|"]
  for method, r in results.items():
    final = np.array(r["final"])
    reach = r.get("reach")
    cells = ["–" if reach is None or axis not in reach else
             _fraction_cell(reach[axis]) for axis in ("samples", "compute")]
    lines.append(
        f"| {method} | {r['seeds']} | {r['accuracy_mean'][0]:.3f} | "
        f"{final.mean():.3f} ± {final.std():.3f} | {cells[0]} | "
        f"{cells[1]} |")
  return "\n".join(lines)


def regime_statistics(root, seeds, baseline, sft_root=""):
  """Where RL starts in a comparison's regime, and what it costs, per seed.

  Reads each seed's SFT run (`<sft_root or root>/seed<s>/sft`) and the
  baseline's RL run (`<root>/seed<s>/<baseline>`).

  Returns:
    [{seed, start_accuracy (held-out, after SFT), sft_steps, sft_seconds
    (SFT compute, evaluations excluded),
    all_wrong_first (fraction of the first rollout's groups with every
    sample wrong), all_wrong_mean (over the run), zero_signal_mean (groups
    with one outcome for every sample, over the run), rl_step_seconds
    (median), right_wrong_step_first / right_wrong_step_mean (of the right
    answers, those with a step the checker marks wrong: the first rollout's,
    and over the run; None when the task has no step checker)}] for the
    seeds whose runs exist.
  """
  rows = []
  for s in range(seeds):
    sft_dir = os.path.join(sft_root or root, f"seed{s}", "sft")
    path = os.path.join(sft_dir, metrics_lib.SUMMARY_FILE)
    run_dir = os.path.join(root, f"seed{s}", baseline)
    if not os.path.exists(path) or not os.path.isdir(run_dir):
      continue
    summary = metrics_lib.read_json(path)
    sft = summary["stages"]["sft"]
    steps = [r for r in metrics_lib.read_metrics(run_dir)
             if r.get("stage") == "rl" and "train/all_wrong_groups" in r]
    if not steps:
      continue
    rows.append({
        "seed": s, "start_accuracy": sft.get("eval/accuracy"),
        "sft_steps": sft.get("sft/steps"),
        "sft_seconds": sft.get("sft/compute_seconds"),
        "all_wrong_first": steps[0]["train/all_wrong_groups"],
        "all_wrong_mean": float(np.mean(
            [r["train/all_wrong_groups"] for r in steps])),
        "zero_signal_mean": float(np.mean(
            [r["train/zero_outcome_signal_groups"] for r in steps])),
        "rl_step_seconds": float(np.median(
            [r["time/step_s"] for r in steps])),
        "right_wrong_step_first": _right_with_wrong_step(steps[:1]),
        "right_wrong_step_mean": _right_with_wrong_step(steps),
    })
  return rows


def _right_with_wrong_step(steps):
  """Of the right answers of these RL steps, the fraction with a step the
  checker marks wrong (`train/correct_with_wrong_step` and
  `train/reward_mean` are both fractions of a step's rows)."""
  key = "train/correct_with_wrong_step"
  if not all(key in r for r in steps):
    return None
  right = sum(r["train/reward_mean"] for r in steps)
  return sum(r[key] for r in steps) / right if right > 0 else None


def regime_table(rows, baseline) -> str:
  """Markdown of `regime_statistics`."""
  lines = ["| seed | accuracy after SFT (steps, s) | all-wrong groups, first "
           f"rollout / mean over {baseline}'s run | groups without outcome "
           f"signal (mean) | right answers with a wrong step, first / "
           f"mean | {baseline} s per RL step (median) |",
           "|---|---|---|---|---|---|"]
  two = lambda v: "–" if v is None else f"{v:.2f}"
  for r in rows:
    lines.append(
        f"| {r['seed']} | {_fmt(r['start_accuracy'])} ({r['sft_steps']}, "
        f"{r['sft_seconds'] or 0:.0f}) | {r['all_wrong_first']:.2f} / "
        f"{r['all_wrong_mean']:.2f} | {r['zero_signal_mean']:.2f} | "
        f"{two(r['right_wrong_step_first'])} / "
        f"{two(r['right_wrong_step_mean'])} | {r['rl_step_seconds']:.2f} |")
  return "\n".join(lines)


# The quality of a comparison's verifiers on their label set's held-out
# problems: (summary key of the prm stage, column header).
VERIFIER_COLUMNS = (
    ("prm/valid_auroc_vs_oracle", "step AUROC vs the checker"),
    ("prm/valid_f1_at_half", "first-error F1 vs the checker"),
    ("prm/valid_auroc_vs_labels", "step AUROC vs its labels"),
)
LABELS_AUROC = "labels/q_auroc_vs_oracle"


def verifier_statistics(root, seeds, names) -> list:
  """Per verifier of a comparison, its quality on each seed.

  Reads `<root>/seed<s>/<name>/summary.json` for each verifier directory in
  `names`, and the label set they were trained on (`<root>/seed<s>/labels`),
  whose own Q-hat ranks steps against the checker with `LABELS_AUROC`: the
  most a verifier fitted to those labels can show.

  Returns:
    [{name, model, target, label_problems, per_seed: {key: [value of seed
    0, 1, ..., None where not measured]}, mean: {key: mean over the seeds
    that measured it}}]: "labels" first when measured, then each verifier
    trained on some seed. A metric is not measured (NaN in the summary)
    when the held-out solutions lack one of its classes, e.g. F1 without
    solutions whose every step is right.
  """
  rows = []
  for name in ["labels"] + list(names):
    per_seed, info = {}, {}
    for s in range(seeds):
      path = os.path.join(root, f"seed{s}", name, metrics_lib.SUMMARY_FILE)
      stages = (metrics_lib.read_json(path)["stages"]
                if os.path.exists(path) else {})
      if name == "labels":
        keys, stage = (LABELS_AUROC,), stages.get("labels", {})
      else:
        keys, stage = [k for k, _ in VERIFIER_COLUMNS], stages.get("prm", {})
        if stage:
          info = {"model": stage.get("prm/model"),
                  "target": stage.get("prm/target"),
                  "label_problems": stage.get("prm/label_problems")}
      for key in keys:
        value = stage.get(key)
        per_seed.setdefault(key, []).append(
            None if value is None or np.isnan(value) else float(value))
    mean = {k: float(np.mean([x for x in v if x is not None]))
            for k, v in per_seed.items() if any(x is not None for x in v)}
    if mean or info:  # A trained verifier is listed, measured or not.
      rows.append({"name": name, **info, "per_seed": per_seed, "mean": mean})
  return rows


def verifier_table(rows) -> str:
  """Markdown of `verifier_statistics`: mean (seed 0, 1, ...) per column."""
  def cell(row, key):
    if key not in row["mean"]:
      return "–"
    seeds = ", ".join("–" if v is None else f"{v:.2f}"
                      for v in row["per_seed"][key])
    return f"{row['mean'][key]:.2f} ({seeds})"
  lines = ["| verifier | model, target | " +
           " | ".join(h for _, h in VERIFIER_COLUMNS) + " |",
           "|---|---|" + "---|" * len(VERIFIER_COLUMNS)]
  for row in rows:
    if row["name"] == "labels":
      cells = [cell(row, LABELS_AUROC)] + ["–"] * (len(VERIFIER_COLUMNS) - 1)
      lines.append("| labels (Q̂ itself) | Monte-Carlo rollouts | " +
                   " | ".join(cells) + " |")
      continue
    cells = [cell(row, key) for key, _ in VERIFIER_COLUMNS]
    lines.append(f"| {row['name']} | {row['model']}, {row['target']} | " +
                 " | ".join(cells) + " |")
  return "\n".join(lines)


# Per-step diagnostics of the RL stage that say where a method's signal is
# (runners/rl.py): (metrics key, column header).
DIAGNOSTICS = (
    ("train/zero_outcome_signal_groups", "groups without outcome signal"),
    ("train/nonzero_advantage_fraction", "tokens with A ≠ 0"),
    ("train/advantage_var_outcome", "Var A outcome"),
    ("train/advantage_var_process", "Var A process"),
    ("train/process_blames_first_error", "process blames the first error"),
    ("train/process_negative_at_first_error", "process < 0 at the first error"),
    ("train/process_negative_on_correct_rows", "process < 0 on a correct row"),
    ("prm/first_error_agreement", "verifier first-error agreement"),
)


def diagnostics(root, methods, seeds) -> dict:
  """{method: {metric: mean over every RL step of every seed}} of
  `DIAGNOSTICS` (a metric a method does not log is absent)."""
  out = {}
  for method in methods:
    values = {}
    for s in range(seeds):
      workdir = os.path.join(root, f"seed{s}", method)
      if method == "sft_continue" or not os.path.isdir(workdir):
        continue
      for record in metrics_lib.read_metrics(workdir):
        if record.get("stage") != "rl":
          continue
        for key, _ in DIAGNOSTICS:
          if key in record:
            values.setdefault(key, []).append(record[key])
    if values:
      out[method] = {k: float(np.mean(v)) for k, v in values.items()}
  return out


def diagnostics_table(means: dict) -> str:
  """Markdown of `diagnostics` ('–' where a method has no such signal)."""
  lines = ["| method | " + " | ".join(h for _, h in DIAGNOSTICS) + " |",
           "|---|" + "---|" * len(DIAGNOSTICS)]
  for method, values in means.items():
    cells = [_fmt(values.get(key)) for key, _ in DIAGNOSTICS]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_comparison(results, path, title=""):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for i, (method, r) in enumerate(results.items()):
    # Ten colours, then the same colours dashed: every method its own line.
    style = {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[i // 10 % 3]}
    mean, std = np.array(r["accuracy_mean"]), np.array(r["accuracy_std"])
    if method != "sft_continue":
      x = np.array(r["samples"])
      axes[0].plot(x, mean, label=method, **style)
      axes[0].fill_between(x, mean - std, mean + std, alpha=0.15,
                           color=style["color"])
    x = np.array(r["seconds"])
    axes[1].plot(x, mean, label=method, **style)
    axes[1].fill_between(x, mean - std, mean + std, alpha=0.15,
                         color=style["color"])
  axes[0].set_xlabel("RL samples")
  axes[1].set_xlabel("compute (s): RL, plus labels and verifier training")
  for ax in axes:
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7, ncol=2)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def tokens_to_match(curve, tokens):
  """Best-of-N tokens interpolated (log-linear) at a given accuracy.

  None outside the curve's accuracies, and for a curve whose accuracy does
  not grow with its tokens (a verifier that picks worse answers the more it
  sees): the tokens "needed" for an accuracy are then not defined.
  """
  points = sorted((p["accuracy"], p["tokens_per_problem"]) for p in curve)
  accs = [a for a, _ in points]
  by_tokens = [p["accuracy"] for p in sorted(
      curve, key=lambda p: p["tokens_per_problem"])]
  if any(b < a for a, b in zip(by_tokens, by_tokens[1:])):
    return None
  if tokens is None or not accs or tokens > accs[-1] or tokens < accs[0]:
    return None
  logs = np.interp(tokens, accs, [np.log(t) for _, t in points])
  return float(np.exp(logs))


def search_table(curves) -> str:
  """Markdown table of search curves, each matched to Best-of-N tokens."""
  lines = ["| method | budget | tokens / problem | accuracy | Best-of-N "
           "tokens for the same accuracy |", "|---|---|---|---|---|"]
  for method, curve in curves.items():
    is_best_of_n = method.endswith("best_of_n")
    # Beam search is matched against Best-of-N with the same verifier.
    reference = curves.get("oracle_best_of_n" if method.startswith("oracle_")
                           else "best_of_n", [])
    for point in curve:
      match = ("" if is_best_of_n else
               tokens_to_match(reference, point["accuracy"]))
      ratio = ("" if not match else
               f"{match:.0f} ({match / point['tokens_per_problem']:.2f}x)")
      budget = f"N={point['budget']}" if is_best_of_n else (
          f"B={point['budget']}")
      lines.append(f"| {method} | {budget} | "
                   f"{point['tokens_per_problem']:.0f} | "
                   f"{point['accuracy']:.3f} | {ratio or '-'} |")
  return "\n".join(lines)
