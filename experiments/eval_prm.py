"""Evaluates a trained PRM: in the task, on ProcessBench files, Best-of-N.

    python -m experiments.eval_prm --workdir=runs/prm
    python -m experiments.eval_prm --workdir=runs/prm --bon_problems=100 \\
        --output_dir=runs/prm/eval_prm_100
    python -m experiments.eval_prm --workdir=runs/prm \\
        --processbench=data/gsm8k.jsonl,data/math.jsonl
    python -m experiments.eval_prm --workdir=runs/prm \\
        --bon_path=data/gsm8k_test.jsonl --bon_samples=16
    python -m experiments.eval_prm --workdir=runs/prm \\
        --export_processbench=runs/prm/eval_prm/arith.jsonl

`--workdir` is a run with a finished PRM (`configs/prm.py`, or any run with
the prm stage or `prm.init_from`); its policy comes from its SFT stage (or
`sft.init_from`), or is the checkpoint of a PRM trained from a file
(`configs/prm.py:data=file`). Without file flags the evaluation is the prm_eval stage's,
with the run's `prm_eval` settings unless overridden here: held-out
solutions are sampled from the policy; the first-error threshold is chosen
on separate validation problems (the grid 0.01..0.99 maximising F1 there)
and applied to the test problems; Best-of-N uses N = 1, 4, 16, 64 of
`bon_samples` samples per problem, averaged over disjoint groups. The
trained PRM is compared with the oracle PRM (the task's step checker) and a
random scorer. Writes `summary.json` and `table.txt`.

`--processbench` scores every step of every solution of ProcessBench-format
files (`rl_rewards/prm/processbench.py`) as RL scores rollouts, and reports
per file (subset: the file's stem) the accuracy on erroneous and on correct
solutions, their harmonic mean F1 and the first-error step AUROC, with
ProcessBench's rule for PRMs: a step is wrong when its score is at most
`--threshold` (0.5: the argmax of the PRM's two classes). Writes
`processbench.md` and `processbench.json`.

`--bon_path` samples `--bon_samples` solutions for each problem of a
question/answer file (the run's `task.preset` and `task.fields`, or
`--bon_preset`), checks them with math-verify and reports PRM Best-of-N
(min, last, product, mean and PRM-weighted votes) against majority vote and
pass@N. Writes `best_of_n.md` and `best_of_n.json`.

`--export_processbench` writes the held-out test solutions of the in-task
evaluation as a ProcessBench file with the step checker's first-error
labels, and `export.json` with the in-task metrics of the PRM on them: the
ProcessBench path at the same threshold gives the same F1 and accuracies.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from rl_rewards import cli
from rl_rewards import config_data
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.data import readers
from rl_rewards.prm import processbench
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_eval
from rl_rewards.runners import prm_stages

_WORKDIR = flags.DEFINE_string("workdir", None, "Run with a trained PRM.",
                               required=True)
_OUTPUT = flags.DEFINE_string("output_dir", None,
                              "Output directory (default <workdir>/eval_prm).")
_NUM_PROBLEMS = flags.DEFINE_integer("num_problems", 0,
                                     "Test problems (0: the run's setting).")
_VALID_PROBLEMS = flags.DEFINE_integer(
    "valid_problems", 0, "Threshold-selection problems (0: the run's).")
_BON_PROBLEMS = flags.DEFINE_integer(
    "bon_problems", 0, "Best-of-N problems (0: the run's; with --bon_path, "
    "0 is every problem of the file).")
_BON_SAMPLES = flags.DEFINE_integer("bon_samples", 0,
                                    "Samples per Best-of-N problem (0: run's).")
_PROCESSBENCH = flags.DEFINE_list(
    "processbench", [], "ProcessBench-format files (JSONL, JSON, Parquet), "
    "one subset each, named by the file's stem.")
_THRESHOLD = flags.DEFINE_float(
    "threshold", processbench.DEFAULT_THRESHOLD,
    "ProcessBench: a step whose score is at most this is wrong.")
_INNER_DELIMITER = flags.DEFINE_enum(
    "inner_delimiter", "error", processbench.INNER_DELIMITER,
    "ProcessBench: a step holding the task's delimiter is an error, or has "
    "it replaced by a space.")
_BON_PATH = flags.DEFINE_string(
    "bon_path", None, "A question/answer file for Best-of-N (GSM8K/MATH).")
_BON_PRESET = flags.DEFINE_string(
    "bon_preset", None, "Layout of --bon_path (gsm8k, math, math500, ...; "
    "default: the run's task.preset and task.fields).")
_EXPORT = flags.DEFINE_string(
    "export_processbench", None, "Write the in-task held-out solutions with "
    "their first-error labels as a ProcessBench file here.")


def _write_table(output, name, table, values):
  metrics_lib.write_json_atomic(os.path.join(output, name + ".json"), values)
  with open(os.path.join(output, name + ".md"), "w") as f:
    f.write(table + "\n")


def _bon_fields(config):
  if _BON_PRESET.value:
    try:
      return readers.field_map(_BON_PRESET.value)
    except ValueError as e:
      raise config_lib.ConfigError(f"--bon_preset: {e}") from None
  if config.task.name in ("gsm8k", "math"):
    return config_data.task_fields(config.task)
  raise config_lib.ConfigError(
      "--bon_path: name the file's layout with --bon_preset (the run's "
      f"task {config.task.name!r} reads no files).")


def _bon_table(values) -> str:
  return (f"Best-of-N on {values['path']} ({values['prm_eval/problems']} "
          f"problems, {values['prm_eval/samples']} samples each; "
          "math-verify)\n" + prm_eval.format_eval_table(values))


def main(argv):
  del argv
  # Library INFO logs (orbax restoring checkpoints) would drown the tables.
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  config = prm_stages.run_config(workdir)
  for key, flag in (("num_problems", _NUM_PROBLEMS),
                    ("valid_problems", _VALID_PROBLEMS),
                    ("bon_problems", _BON_PROBLEMS),
                    ("bon_samples", _BON_SAMPLES)):
    # With --bon_path the Best-of-N flags are the file's, not the run's
    # (the output directory's config.json stays the run's).
    if flag.value and not (_BON_PATH.value and key.startswith("bon_")):
      config.prm_eval[key] = flag.value
  # Files are read before any model is loaded: a malformed row fails first.
  rows = {}
  for path in _PROCESSBENCH.value:
    name = processbench.subset_name(path)
    if name in rows:
      raise config_lib.ConfigError(
          f"--processbench: two files have the subset name {name!r}.")
    rows[name] = processbench.read_file(path)
  bon_fields = _bon_fields(config) if _BON_PATH.value else None
  output = _OUTPUT.value or os.path.join(workdir, "eval_prm")
  ctx = pipeline.build_context(config, output)
  policy, prm = prm_stages.run_policy_and_prm(ctx, workdir)
  files_only = bool(rows or _BON_PATH.value or _EXPORT.value)
  if _EXPORT.value:
    values = prm_eval.export_processbench(ctx, policy, prm, _EXPORT.value)
    values["path"] = _EXPORT.value
    values["command"] = (
        f"python -m experiments.eval_prm --workdir={workdir} "
        f"--processbench={_EXPORT.value} "
        f"--threshold={values['prm_eval/threshold']}")
    metrics_lib.write_json_atomic(os.path.join(output, "export.json"),
                                  values)
    print(json.dumps(values, indent=1), flush=True)
  if rows:
    results = prm_eval.processbench_files(
        ctx, prm, rows,
        threshold=_THRESHOLD.value, inner_delimiter=_INNER_DELIMITER.value)
    table = processbench.format_table(results)
    print(table, flush=True)
    _write_table(output, "processbench", table, results)
  if _BON_PATH.value:
    values = prm_eval.best_of_n_file(
        ctx, policy, prm, _BON_PATH.value, fields=bon_fields,
        num_samples=_BON_SAMPLES.value or config.prm_eval.bon_samples,
        num_problems=_BON_PROBLEMS.value)
    values["path"] = _BON_PATH.value
    table = _bon_table(values)
    print(table, flush=True)
    _write_table(output, "best_of_n", table, values)
  if files_only:
    return
  summary = prm_eval.evaluate_prm(ctx, policy, prm)
  table = prm_eval.format_eval_table(summary)
  print(table, flush=True)
  metrics_lib.write_summary(output, summary)
  with open(os.path.join(output, "table.txt"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  cli.define_debug_flag()
  app.run(cli.reporting_errors(main))
