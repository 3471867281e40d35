"""Step-level beam search with a PRM or PAV against PRM Best-of-N.

    python -m experiments.search --workdir=runs/prm
    python -m experiments.search --workdir=runs/pav --modes=prm,pav \\
        --beam_widths=1,2,4,8 --candidates=3 --alpha=0.5 --prover_k=4

`--workdir` is a run with a finished PRM (its policy: the SFT stage or
`sft.init_from`). On `num_problems` held-out problems it measures accuracy
against compute, counted as tokens generated per problem:

* Best-of-N: N full samples, the one with the highest aggregated PRM score;
* beam search (`rl_rewards/prm/search.py`): B beams, C candidate steps per
  beam and round, the best B kept by the PRM score (`prm`) or by the PAV
  effective score Q + alpha * (Q^mu_k - Q^mu_{k-1}) with a Best-of-K prover
  (`pav`); the answer is the finished beam with the highest final score.
  `oracle_prm` / `oracle_pav` run the same search with the task's step
  checker as a perfect prover, the upper bound of a learned verifier.

Sampling temperature and top-p are the same for every method. Writes
`search.json` (the curves), `search.md` (the table, and the Best-of-N token
budget each beam-search point matches) and `search.png` to the output
directory.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from experiments.benchmarks import results as results_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import reports
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_eval
from rl_rewards.runners import prm_stages

_WORKDIR = flags.DEFINE_string("workdir", None, "Run with a trained PRM.",
                               required=True)
_OUTPUT = flags.DEFINE_string("output_dir", None,
                              "Output directory (default <workdir>/search).")
_NUM_PROBLEMS = flags.DEFINE_integer("num_problems", 100, "Held-out problems.")
_MODES = flags.DEFINE_list(
    "modes", ["prm", "pav"], "Beam-search scores: prm | pav | oracle_prm | "
    "oracle_pav (the task's step checker as a perfect prover).")
_BEAMS = flags.DEFINE_list("beam_widths", ["1", "2", "4", "8"], "Beams B.")
_CANDIDATES = flags.DEFINE_integer("candidates", 3,
                                   "Candidate steps per beam (C).")
_BEST_OF_N = flags.DEFINE_list("best_of_n", ["1", "2", "4", "8", "16", "32"],
                               "Best-of-N budgets.")
_ALPHA = flags.DEFINE_float("alpha", 0.5, "PAV alpha.")
_PROVER_K = flags.DEFINE_integer("prover_k", 4, "Best-of-K prover K.")
_AGGREGATION = flags.DEFINE_string(
    "aggregation", "min", "Step-score aggregation of Best-of-N and prm-mode "
    "beams: min | last | product | mean.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_RESULTS = flags.DEFINE_string(
    "results", "", "Also add these curves, as the verifier `--results_name`, "
    "to a published results file (docs/results/search.json), replacing that "
    "verifier's earlier curves.")
_RESULTS_NAME = flags.DEFINE_string(
    "results_name", "", "The verifier's name in `--results` (e.g. "
    "\"generative PRM\").")


def plot(curves, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  for method, curve in curves.items():
    ax.plot([p["tokens_per_problem"] for p in curve],
            [p["accuracy"] for p in curve], marker="o", label=method)
  ax.set_xscale("log")
  ax.set_xlabel("generated tokens per problem")
  ax.set_ylabel("accuracy")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)


def main(argv):
  del argv
  # Library INFO logs (orbax restoring checkpoints) would drown the table.
  logging.set_verbosity(logging.WARNING)
  if _RESULTS.value and not _RESULTS_NAME.value:
    raise app.UsageError("--results needs --results_name.")
  start = results_lib.started()
  workdir = _WORKDIR.value
  config = prm_stages.run_config(workdir)
  output = _OUTPUT.value or os.path.join(workdir, "search")
  ctx = pipeline.build_context(config, output)
  policy, prm = prm_stages.run_policy_and_prm(ctx, workdir)
  curves = prm_eval.search_compute_curve(
      ctx, policy, prm, num_problems=_NUM_PROBLEMS.value,
      beam_widths=[int(b) for b in _BEAMS.value],
      candidates=_CANDIDATES.value,
      best_of_n=[int(n) for n in _BEST_OF_N.value], alpha=_ALPHA.value,
      prover_k=_PROVER_K.value, aggregation=_AGGREGATION.value,
      modes=tuple(_MODES.value), temperature=_TEMPERATURE.value)
  table = reports.search_table(curves)
  print(table, flush=True)
  metrics_lib.write_json_atomic(os.path.join(output, "search.json"), curves)
  with open(os.path.join(output, "search.md"), "w") as f:
    f.write(table + "\n")
  plot(curves, os.path.join(output, "search.png"))
  if _RESULTS.value:
    settings = {"num_problems": _NUM_PROBLEMS.value,
                "candidates": _CANDIDATES.value, "alpha": _ALPHA.value,
                "prover_k": _PROVER_K.value,
                "aggregation": _AGGREGATION.value,
                "temperature": _TEMPERATURE.value}
    results_lib.add_search_run(_RESULTS.value, _RESULTS_NAME.value, curves,
                               settings, start)
  print(json.dumps({"output": output}))


if __name__ == "__main__":
  app.run(main)
