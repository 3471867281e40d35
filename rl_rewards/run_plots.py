"""A run's curves, read from its `metrics.jsonl`, drawn to one PNG.

    path = run_plots.plot_run("runs/default")   # -> runs/default/curves.png

One row per stage present (in the order the run wrote them), one column per
kind of curve, each against the stage's own step:

* reward: the RL rollout reward (`train/reward_mean`); stages without a
  reward show their training loss (SFT, the verifier) or, for labels, the
  mean Monte-Carlo value and outcome of the labelled solutions;
* held-out accuracy: `eval/accuracy`, `eval/pass@n`, the SFT gate;
* length and steps: tokens per response (solid, left axis) and steps per
  response (dashed, right axis), of rollouts and of evaluations;
* verifier agreement: the verifier against the task's step checker during RL
  (`prm/*_agreement`), its validation quality, the labels against the oracle;
* time per phase: `time/*` seconds (per RL step: rollout, reward, verifier,
  advantage, update, eval; cumulative compute for SFT and the verifier);
* tokens/s: `perf/*`.

Reads only (never writes) the run's files; `experiments/plot.py` is the
command line. A metric written twice at one step (a stage's final summary
repeating its last step) keeps its first value, as in TensorBoard.
"""

import math
import os

from rl_rewards import metrics as metrics_lib

DEFAULT_FILE = "curves.png"

PANELS = ("reward", "held-out accuracy", "length and steps",
          "verifier agreement", "time per phase", "tokens/s")

_REWARD_KEYS = ("train/reward_mean",)
_LOSS_KEYS = ("train/loss", "train/prm_loss", "labels/q_mean",
              "labels/outcome_mean")
_AGREEMENT_WORDS = ("agreement", "auroc", "f1", "abs_error", "at_last",
                    "vs_oracle", "step_accuracy")


def _is_accuracy(key):
  return (key in ("eval/accuracy", "gate/accuracy") or
          key.startswith("eval/pass@"))


def _is_agreement(key):
  if key == "eval/step_accuracy":
    return False  # The policy's own step accuracy, not the verifier's.
  head = key.split("/")[0]
  return (head in ("prm", "prm_eval", "labels", "train") and
          any(word in key for word in _AGREEMENT_WORDS))


def _panel_keys(panel, keys):
  """The metrics of `keys` (one stage's) a panel draws, and axis labels."""
  keys = sorted(keys)
  if panel == "reward":
    chosen = [k for k in _REWARD_KEYS if k in keys]
    if chosen:
      return chosen, "reward"
    chosen = [k for k in _LOSS_KEYS if k in keys]
    if any(k.startswith("labels/") for k in chosen):
      return chosen, "label value"
    return chosen, "loss"
  if panel == "held-out accuracy":
    return [k for k in keys if _is_accuracy(k)], "accuracy"
  if panel == "length and steps":
    return [k for k in keys if k.endswith(("response_length",
                                           "mean_length"))], "tokens"
  if panel == "verifier agreement":
    return [k for k in keys if _is_agreement(k)], "agreement / error"
  if panel == "time per phase":
    return [k for k in keys if k.startswith("time/")], "seconds"
  if panel == "tokens/s":
    return [k for k in keys if k.startswith("perf/")], "tokens / s"
  raise ValueError(f"unknown panel {panel!r}")


def run_curves(records) -> dict:
  """{stage: {metric: (steps, values)}} of numeric metrics, in write order
  of the stages; each metric keeps its first value at a step."""
  curves = {}
  for record in records:
    stage, step, _, scalars = metrics_lib.scalar_entry(record)
    stage_curves = curves.setdefault(stage, {})
    for key, value in scalars.items():
      steps, values = stage_curves.setdefault(key, ([], []))
      if steps and step <= steps[-1]:
        continue
      steps.append(step)
      values.append(value)
  return curves


def _plot_lines(ax, curve, keys, *, style="-", first_color=0):
  for i, key in enumerate(keys):
    steps, values = curve[key]
    finite = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    if not finite:
      continue
    xs, ys = zip(*finite)
    ax.plot(xs, ys, style, marker="o", markersize=2.5, linewidth=1.2,
            label=key, color=f"C{(first_color + i) % 10}")


def figure(records, title: str = ""):
  """A matplotlib Figure of the run's curves (see the module docstring)."""
  from matplotlib import figure as figure_lib  # pylint: disable=g-import-not-at-top
  curves = run_curves(records)
  if not curves:
    raise ValueError("no metrics to plot")
  stages = list(curves)
  fig = figure_lib.Figure(figsize=(3.3 * len(PANELS), 2.7 * len(stages) + 0.6),
                          layout="constrained")
  axes = fig.subplots(len(stages), len(PANELS), squeeze=False)
  for row, stage in enumerate(stages):
    curve = curves[stage]
    for col, panel in enumerate(PANELS):
      ax = axes[row][col]
      keys, ylabel = _panel_keys(panel, curve)
      shown = ylabel if panel == "reward" else panel  # Loss when no reward.
      ax.set_title(f"{stage}: {shown}", fontsize=9)
      if not keys:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center",
                transform=ax.transAxes, color="0.6", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        continue
      _plot_lines(ax, curve, keys)
      if panel == "length and steps":
        steps_keys = [k for k in curve if k.endswith("steps_per_response")]
        if steps_keys:
          twin = ax.twinx()
          _plot_lines(twin, curve, sorted(steps_keys), style="--",
                      first_color=len(keys))
          twin.set_ylabel("steps", fontsize=8)
          twin.tick_params(labelsize=7)
          handles = (ax.get_legend_handles_labels()[0] +
                     twin.get_legend_handles_labels()[0])
          ax.legend(handles=handles, fontsize=6, loc="best")
        else:
          ax.legend(fontsize=6, loc="best")
      else:
        ax.legend(fontsize=6, loc="best")
      ax.set_xlabel(f"{stage} step", fontsize=8)
      ax.set_ylabel(ylabel, fontsize=8)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title, fontsize=11)
  return fig


def plot_run(workdir: str, path: str = "", *, title: str = "",
             dpi: int = 100) -> str:
  """Draws `workdir`'s curves to `path` (default `<workdir>/curves.png`),
  titled `title` (default: the workdir).

  Returns:
    The PNG's path.

  Raises:
    ValueError: the workdir has no metrics yet.
  """
  records = metrics_lib.read_metrics(workdir)
  if not records:
    raise ValueError(f"{workdir} has no metrics "
                     f"({os.path.join(workdir, metrics_lib.METRICS_FILE)} is "
                     "missing or empty).")
  path = path or os.path.join(workdir, DEFAULT_FILE)
  fig = figure(records, title=title or workdir)
  fig.savefig(path, dpi=dpi)
  return path
