"""Reports over finished workdirs: sweep tables and method comparisons.

Reads `summary.json` and `metrics.jsonl` files (never writes them) and turns
them into markdown tables, JSON-ready dicts and PNG plots, for
`experiments/sweep.py` and `experiments/compare.py`.
"""

import os

import numpy as np

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib

SWEEP_COLUMNS = ("eval/accuracy", "eval/pass@8", "eval/step_accuracy")


def collect_sweep(root, points):
  rows = []
  for overrides in points:
    workdir = os.path.join(root, cli.point_name(overrides))
    path = os.path.join(workdir, metrics_lib.SUMMARY_FILE)
    summary = metrics_lib.read_json(path) if os.path.exists(path) else None
    rows.append({"point": cli.point_name(overrides), "workdir": workdir,
                 "summary": summary})
  return rows


def sweep_table(rows) -> str:
  header = ["point", "SFT acc"] + [f"RL {c.split('/')[1]}" for c in SWEEP_COLUMNS]
  header.append("wall s")
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for row in rows:
    summary = row["summary"]
    if summary is None:
      lines.append(f"| {row['point']} | failed |" + " |" * (len(header) - 2))
      continue
    stages = summary["stages"]
    sft = stages.get("sft", {}).get("eval/accuracy")
    rl = stages.get("rl", {})
    cells = [row["point"], _fmt(sft)] + [_fmt(rl.get(c)) for c in SWEEP_COLUMNS]
    cells.append(f"{summary['wall_time_s']:.0f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _fmt(value):
  return "–" if value is None else f"{value:.3f}"


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


def summarize_comparison(root, methods, seeds, baseline):
  results = {}
  for method in methods:
    runs = [run_curves(os.path.join(root, f"seed{s}", method), method)
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


def comparison_table(results, baseline):
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


def plot_comparison(results, path):
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


def tokens_to_match(curve, tokens):
  """Best-of-N tokens interpolated (log-linear) at a given accuracy."""
  points = sorted((p["accuracy"], p["tokens_per_problem"]) for p in curve)
  accs = [a for a, _ in points]
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
