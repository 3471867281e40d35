"""The ProcessBench path on a `test`-size PRM run: the arithmetic task's
held-out solutions, exported as a ProcessBench file, score the same through
`eval_prm --processbench` as in the task's own first-error evaluation.

As in stages_test.py, the samplers are a scripted policy that writes each
step right with probability 0.75 (a `test`-size policy solves nothing, and
first-error F1 needs correct and faulty solutions); SFT, the label store,
PRM training, the scorer and the metrics run as in a real run.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards.prm import processbench
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_eval
from rl_rewards.runners import prm_stages

from . import fakes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _config():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py") +
      ":size=test,model=head,target=soft")
  config.stages = "sft,labels,prm"
  return config


def _scripted(ctx, params, *, temperature, max_new_tokens=0):
  del params, temperature
  return fakes.ScriptedPolicy(
      ctx.task.tokenizer, p_correct=0.75,
      max_new_tokens=max_new_tokens or ctx.task.max_new_tokens)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A finished PRM run and the export of its held-out solutions."""
  workdir = str(tmp_path_factory.mktemp("prm_run"))
  out = str(tmp_path_factory.mktemp("eval"))
  path = os.path.join(out, "arith.jsonl")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(prm_stages, "policy_sampler", _scripted)
    pipeline.run(_config(), workdir)
    config = prm_stages.run_config(workdir)
    ctx = pipeline.build_context(config, os.path.join(out, "ctx"))
    policy, prm = prm_stages.run_policy_and_prm(ctx, workdir)
    in_task = prm_eval.export_processbench(ctx, policy, prm, path)
    ctx.writer.close()
  return workdir, path, in_task, ctx, prm


def test_export_rows(run):
  _, path, in_task, ctx, _ = run
  rows = processbench.read_file(path)
  assert len(rows) == ctx.config.prm_eval.num_problems == in_task[
      "export/rows"]
  # The scripted policy finishes every solution: its steps encode back to
  # the sampled tokens exactly.
  assert in_task["export/reencoded_differently"] == 0
  labels = np.array([r.label for r in rows])
  assert 0 < np.mean(labels >= 0) < 1
  assert np.mean(labels >= 0) == in_task["prm_eval/erroneous_fraction"]
  for row in rows:
    # The label is the step checker's first error on the file's steps.
    verdict = ctx.task.score([_problem(ctx, row)], ["\n".join(row.steps)],
                             [True])
    assert verdict.first_error[0] == row.label
    assert bool(verdict.rewards[0]) == row.final_answer_correct


def _problem(ctx, row):
  split, index = row.id.rsplit("-", 1)
  return ctx.task.problems(split, int(index), 1)[0]


def test_processbench_path_equals_in_task_evaluation(run):
  _, path, in_task, ctx, prm = run
  threshold = in_task["prm_eval/threshold"]
  results = prm_eval.processbench_files(
      ctx, prm, {"arith": processbench.read_file(path)}, threshold=threshold)
  got = results["arith"]
  for key in ("f1", "acc_err", "acc_cor"):
    want = in_task[f"prm_eval/{key}"]
    assert got[key] == want or (np.isnan(got[key]) and np.isnan(want)), key
  assert got["auroc"] == in_task["prm_eval/first_error_auroc"]
  # Not only the metrics at one threshold: every step score is the one the
  # task's evaluation reads off the sampled tokens (same solutions: the
  # same random stream), so the two agree at any threshold.
  scorer = prm_stages.load_scorer(ctx, prm)
  data = prm_eval.first_error_sets(
      ctx, _scripted(ctx, None, temperature=1.0),
      rng=ctx.rng("prm_eval/processbench"))
  want = prm_eval.score_solutions(ctx, scorer, data["test"][0],
                                  ctx.config.prm_eval.prompts_per_batch)
  rows = processbench.read_file(path)
  task = ctx.task
  prompts, responses = processbench.encode_rows(task, rows,
                                                max_prompt_len=64)
  got_scores = processbench.score_rows(
      task, scorer, rows, prompts, responses,
      prompt_width=task.max_prompt_len, response_budget=task.max_new_tokens,
      num_steps=ctx.config.task.max_steps,
      batch_rows=ctx.config.prm_eval.prompts_per_batch)
  np.testing.assert_array_equal(got_scores["step_mask"], want["step_mask"])
  np.testing.assert_array_equal(got_scores["step_scores"],
                                want["step_scores"])
  np.testing.assert_array_equal([r.label for r in rows], data["test"][1])
  # The oracle's scores through the same path give F1 = 1.
  scores = np.zeros((len(rows), ctx.config.task.max_steps))
  mask = np.zeros(scores.shape, bool)
  for b, row in enumerate(rows):
    k = len(row.steps)
    mask[b, :k] = True
    scores[b, :k] = 1.0
    if row.label >= 0:
      scores[b, row.label] = 0.0
  assert processbench.file_metrics(scores, mask, [r.label for r in rows])[
      "f1"] == 1.0


def test_cli_prints_and_writes_the_table_quietly(run, tmp_path):
  workdir, path, in_task, _, _ = run
  second = str(tmp_path / "math.jsonl")
  with open(path) as f, open(second, "w") as g:
    g.write(f.read())
  out = str(tmp_path / "out")
  threshold = in_task["prm_eval/threshold"]
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.eval_prm", f"--workdir={workdir}",
       f"--processbench={path},{second}", f"--threshold={threshold}",
       f"--output_dir={out}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.load(open(os.path.join(out, "processbench.json")))
  assert sorted(results) == ["arith", "math"]
  for name in ("arith", "math"):
    assert results[name]["acc_err"] == pytest.approx(
        in_task["prm_eval/acc_err"], nan_ok=True)
    assert results[name]["acc_cor"] == pytest.approx(
        in_task["prm_eval/acc_cor"], nan_ok=True)
  table = open(os.path.join(out, "processbench.md")).read()
  assert table.strip() in proc.stdout
  assert "| mean F1 |" in table
  # No orbax INFO logging: the output is the table and a status line or two.
  lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
  assert not [l for l in lines if l.startswith("I1") or "INFO" in l], lines
  assert len(lines) <= 12, lines


def test_cli_names_a_malformed_row(run, tmp_path):
  workdir = run[0]
  bad = tmp_path / "gsm8k.jsonl"
  bad.write_text(json.dumps({"problem": "1+2=", "steps": ["1+2=3"],
                             "label": 3}) + "\n")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.eval_prm", f"--workdir={workdir}",
       f"--processbench={bad}", f"--output_dir={tmp_path / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2
  assert f"{bad}:1: field 'label' = 3" in proc.stderr


def test_rows_longer_than_the_run_s_step_slots(run, tmp_path):
  _, _, _, ctx, prm = run
  slots = ctx.config.task.max_steps
  path = tmp_path / "long.jsonl"
  path.write_text(json.dumps({"problem": "01+01=", "steps": ["1"] * (
      slots + 3), "label": slots + 1}) + "\n")
  rows = processbench.read_file(str(path))
  # Every step gets its own slot: none is merged into the run's last one.
  prompts, responses = processbench.encode_rows(ctx.task, rows,
                                                max_prompt_len=64)
  scores = processbench.score_rows(
      ctx.task, prm_eval.processbench_scorer(ctx, prm, slots + 3), rows,
      prompts, responses, prompt_width=ctx.task.max_prompt_len,
      response_budget=ctx.task.max_new_tokens, num_steps=slots + 3,
      batch_rows=ctx.config.prm_eval.prompts_per_batch)
  assert scores["step_mask"].tolist() == [[True] * (slots + 3)]
  # The label's step is past the run's slots; the AUROC pairs it with each
  # step before it.
  step = scores["step_scores"][0]
  results = prm_eval.processbench_files(ctx, prm, {"long": rows})
  want_auroc = np.mean([(p > step[slots + 1]) + 0.5 * (p == step[slots + 1])
                        for p in step[:slots + 1]])
  assert results["long"]["auroc"] == pytest.approx(want_auroc)
  assert results["long"]["num_err"] == 1
