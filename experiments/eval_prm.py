"""Evaluates a trained PRM: first-error F1, step AUROC and Best-of-N.

    python -m experiments.eval_prm --workdir=runs/prm
    python -m experiments.eval_prm --workdir=runs/prm --bon_problems=100 \\
        --output_dir=runs/prm/eval_prm_100

`--workdir` is a run with a finished PRM (`configs/prm.py`, or any run with
the prm stage or `prm.init_from`); its policy comes from its SFT stage (or
`sft.init_from`). The evaluation is the prm_eval stage's, with the run's
`prm_eval` settings unless overridden here: held-out solutions are sampled
from the policy; the first-error threshold is chosen on separate validation
problems (the grid 0.01..0.99 maximising F1 there) and applied to the test
problems; Best-of-N uses N = 1, 4, 16, 64 of `bon_samples` samples per
problem, averaged over disjoint groups. The trained PRM is compared with
the oracle PRM (the task's step checker) and a random scorer. Writes
`summary.json` and `table.txt` to the output directory.
"""

import os

from absl import app
from absl import flags

from rl_rewards import metrics as metrics_lib
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
_BON_PROBLEMS = flags.DEFINE_integer("bon_problems", 0,
                                     "Best-of-N problems (0: the run's).")
_BON_SAMPLES = flags.DEFINE_integer("bon_samples", 0,
                                    "Samples per Best-of-N problem (0: run's).")


def main(argv):
  del argv
  workdir = _WORKDIR.value
  config = prm_stages.run_config(workdir)
  for key, flag in (("num_problems", _NUM_PROBLEMS),
                    ("valid_problems", _VALID_PROBLEMS),
                    ("bon_problems", _BON_PROBLEMS),
                    ("bon_samples", _BON_SAMPLES)):
    if flag.value:
      config.prm_eval[key] = flag.value
  output = _OUTPUT.value or os.path.join(workdir, "eval_prm")
  ctx = pipeline.build_context(config, output)
  policy, prm = prm_stages.run_policy_and_prm(ctx, workdir)
  summary = prm_eval.evaluate_prm(ctx, policy, prm)
  table = prm_eval.format_eval_table(summary)
  print(table, flush=True)
  metrics_lib.write_summary(output, summary)
  with open(os.path.join(output, "table.txt"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
