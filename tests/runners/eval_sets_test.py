"""Held-out sets (`eval.sets`): data checks, per-set pass@1 / pass@k.

The policy is a fake: `evaluation.generate` is replaced by a table of
responses per question, so the metrics can be computed by hand; the data
files, the text task and the math-verify scoring are real.
"""

import itertools
import json
import math
import os
import types

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import config_data
from rl_rewards import config_lib
from rl_rewards.runners import evaluation
from rl_rewards.runners import tasks as tasks_lib

_MATH500 = [
    {"problem": "Half of one?", "solution": r"It is \boxed{\frac{1}{2}}.",
     "answer": r"\frac{1}{2}"},
    {"problem": "Two plus two?", "solution": r"\boxed{4}", "answer": "4"},
    {"problem": "Three squared?", "solution": r"\boxed{9}", "answer": "9"},
]
# The Maxwell-Jia/AIME_2024 layout: capitalised keys, integer answers.
_AIME = [{"ID": "2024-I-1", "Problem": "Find 204.", "Solution": "s",
          "Answer": 204},
         {"ID": "2024-I-2", "Problem": "Find 25.", "Solution": "s",
          "Answer": 25}]
_GSM8K = [{"question": f"What is {i} + 1?", "answer": f"{i}+1={i + 1}\n"
           f"#### {i + 1}"} for i in range(4)]

# question -> n = 4 (response, finished) pairs.
_RESPONSES = {
    # c = 2.
    "Half of one?": [(r"\boxed{\frac{1}{2}}", True), (r"\boxed{3}", True),
                     (r"so $\boxed{0.5}$", True), ("no idea", True)],
    # c = 0.
    "Two plus two?": [(r"\boxed{5}", True)] * 4,
    # c = 3: the truncated right answer scores 0.
    "Three squared?": [(r"\boxed{9}", True)] * 3 + [(r"\boxed{9}", False)],
    # c = 1.
    "Find 204.": [(r"\boxed{204}", True)] + [(r"\boxed{1}", True)] * 3,
    # c = 0.
    "Find 25.": [("", True)] * 4,
}


def _write(tmp_path):
  math500 = tmp_path / "math500.jsonl"
  math500.write_text("".join(json.dumps(r) + "\n" for r in _MATH500))
  aime = tmp_path / "aime_2024.parquet"
  pq.write_table(pa.Table.from_pylist(_AIME), str(aime))
  train = tmp_path / "train.parquet"
  pq.write_table(pa.Table.from_pylist(_GSM8K), str(train), row_group_size=2)
  test = tmp_path / "test.json"
  test.write_text(json.dumps(_GSM8K[:2]))
  return {"math500": str(math500), "aime": str(aime), "train": str(train),
          "test": str(test)}


def _config(files, sets=None):
  config = config_lib.base_config()
  config.task.name = "gsm8k"
  config.stages = "rl"
  config.task.train_path = files["train"]
  config.task.eval_path = files["test"]
  config.eval.sets = sets if sets is not None else (
      f"math500:{files['math500']},aime24:{files['aime']}")
  config.eval.pass_n = 2
  config.eval.sets_samples = 4
  config.eval.sets_temperature = 0.7
  config.eval.size_per_k = 2
  config.eval.pass_size = 2
  return config_lib.validate(config)


def _task(config, workdir):
  return tasks_lib.make_task(config.task, config.seed, tokenizer=object(),
                             workdir=str(workdir),
                             eval_sets=config_data.eval_sets(config))


def _fake_generate(calls):

  def generate(ctx, params, problems, *, batch_size, rng, temperature,
               num_samples=1, top_p=1.0, progress_desc=""):
    del ctx, params, batch_size, rng, top_p
    calls.append((progress_desc, temperature, num_samples, len(problems)))
    texts, finished, index = [], [], []
    for i, problem in enumerate(problems):
      table = _RESPONSES.get(problem.question, [("#### 0", True)] * 4)
      for text, done in itertools.islice(itertools.cycle(table),
                                         num_samples):
        texts.append(text)
        finished.append(done)
        index.append(i)
    lengths = np.array([len(t) for t in texts], np.int32)
    return {"texts": texts, "problems": [problems[j] for j in index],
            "problem_index": np.array(index), "finished": np.array(finished),
            "lengths": lengths, "num_tokens": int(lengths.sum())}

  return generate


def test_pass_at_k_matches_the_binomial_form():
  for n, k in [(1, 1), (4, 1), (4, 2), (8, 8), (16, 5)]:
    correct = np.arange(n + 1)
    want = [1 - math.comb(n - c, k) / math.comb(n, k) for c in correct]
    np.testing.assert_allclose(evaluation.pass_at_k(correct, n, k), want,
                               rtol=1e-12)
  # k = 1 is c / n; k = n is 1[c > 0].
  np.testing.assert_allclose(evaluation.pass_at_k([0, 3, 8], 8, 1),
                             [0, 3 / 8, 1])
  np.testing.assert_array_equal(evaluation.pass_at_k([0, 1, 4], 4, 4),
                                [0, 1, 1])
  with pytest.raises(ValueError, match="1 <= k <= n"):
    evaluation.pass_at_k([1], 4, 5)


def test_each_set_reports_pass_at_1_and_pass_at_k(tmp_path, monkeypatch):
  files = _write(tmp_path)
  config = _config(files)
  task = _task(config, tmp_path / "run")
  assert task.eval_set_names == ("math500", "aime24")
  calls = []
  monkeypatch.setattr(evaluation, "generate", _fake_generate(calls))
  ctx = types.SimpleNamespace(config=config, task=task)
  got = evaluation.evaluate(ctx, None, rng=jax.random.key(0))
  # math500: c = (2, 0, 3) of n = 4; pass@2 = 1 - C(n - c, 2) / C(4, 2).
  #   pass@1 = (2/4 + 0 + 3/4) / 3 = 5/12
  #   pass@2 = ((1 - 1/6) + 0 + 1) / 3 = 11/18  (c = 3: n - c < k gives 1)
  # aime24: c = (1, 0).
  #   pass@1 = (1/4 + 0) / 2 = 1/8
  #   pass@2 = ((1 - C(3, 2) / C(4, 2)) + 0) / 2 = (1 - 3/6) / 2 = 1/4
  assert got["eval/math500/pass@1"] == pytest.approx(5 / 12)
  assert got["eval/math500/pass@2"] == pytest.approx(11 / 18)
  assert got["eval/aime24/pass@1"] == pytest.approx(1 / 8)
  assert got["eval/aime24/pass@2"] == pytest.approx(1 / 4)
  assert got["eval/math500/truncated"] == pytest.approx(1 / 12)
  assert got["eval/aime24/truncated"] == 0.0
  lengths = [len(t) for q in ("Find 204.", "Find 25.")
             for t, _ in _RESPONSES[q]]
  assert got["eval/aime24/mean_length"] == pytest.approx(np.mean(lengths))
  # The task's own evaluation is still there (its answers: "#### 0").
  assert got["eval/accuracy"] == 0.0 and "eval/pass@2" in got
  assert set(k for k in got if k.count("/") == 2) == {
      f"eval/{name}/{metric}" for name in ("math500", "aime24")
      for metric in ("pass@1", "pass@2", "mean_length", "truncated")}
  # Each set once, with its samples, temperature and every problem.
  assert [c for c in calls if c[0].startswith("eval ") and
          c[0] != "eval greedy" and not c[0].startswith("eval pass")] == [
              ("eval math500", 0.7, 4, 3), ("eval aime24", 0.7, 4, 2)]
  # Not in the quick evaluations.
  quick = evaluation.evaluate(ctx, None, rng=jax.random.key(0),
                              with_pass_n=False)
  assert not any(k.count("/") == 2 for k in quick)
  # sets_size keeps the first problems of each set.
  config.eval.sets_size = 1
  got = evaluation.evaluate_sets(ctx, None, rng=jax.random.key(0))
  assert got["eval/math500/pass@1"] == pytest.approx(2 / 4)
  assert got["eval/aime24/pass@2"] == pytest.approx(1 / 2)


def test_data_files_are_checked_before_any_is_prepared(tmp_path):
  files = _write(tmp_path)
  missing = str(tmp_path / "aime_2025.parquet")
  config = _config(files, sets=f"math500:{files['math500']},"
                   f"aime25:{missing}")
  with pytest.raises(config_lib.ConfigError, match=r"config\.eval\.sets "
                     rf"\(aime25\): {missing}: file not found"):
    _task(config, tmp_path / "run")
  # The wrong layout for the set: its first row names the file and row.
  config = _config(files, sets=f"hard:gsm8k:{files['aime']}")
  with pytest.raises(config_lib.ConfigError, match=r"config\.eval\.sets "
                     rf"\(hard\): {files['aime']}: row 0: missing field "
                     r"'question' \(has \['Answer', 'ID', 'Problem', "
                     r"'Solution'\]\)"):
    _task(config, tmp_path / "run")
  config = _config(files, sets="")
  config.task.train_path = files["math500"]  # MATH-500 rows, GSM8K layout.
  with pytest.raises(config_lib.ConfigError, match=r"config\.task\.train_path"
                     rf": {files['math500']}:1: missing field 'question'"):
    _task(config, tmp_path / "run")
  assert not os.path.exists(tmp_path / "run" / "data")


def test_a_layout_without_solutions_runs_rl_but_not_sft(tmp_path):
  files = _write(tmp_path)
  config = _config(files, sets="")
  config.task.name = "math"
  config.task.preset = "aime"
  config.task.train_path = config.task.eval_path = files["aime"]
  task = _task(config_lib.validate(config), tmp_path / "run")
  problems = task.problems("train", 0, 2)
  assert sorted(p.answer for p in problems) == ["204", "25"]
  assert all(p.solution == "" for p in problems)
  scored = task.score(problems, [rf"\boxed{{{p.answer}}}" for p in problems],
                      [True, True])
  np.testing.assert_array_equal(scored.rewards, [1, 1])
  with pytest.raises(config_lib.ConfigError, match=r"config\.task\.fields: "
                     "the data has no reference solutions"):
    task.references(problems)


def test_reasoning_gym_task_with_a_held_out_set(tmp_path):
  files = _write(tmp_path)
  config = config_lib.base_config()
  config.task.name = "reasoning_gym"
  config.task.dataset = "chain_sum"
  config.task.train_size, config.task.eval_size = 4, 2
  config.eval.sets = f"math500:{files['math500']}"
  task = _task(config_lib.validate(config), tmp_path / "run")
  (problem,) = task.eval_set_problems("math500", 1)
  assert (problem.question, problem.answer, problem.entry) == (
      "Half of one?", r"\frac{1}{2}", None)
  assert problem.solution == r"It is \boxed{\frac{1}{2}}."
  # The task's own problems keep their reasoning-gym entries.
  assert task.problems("eval", 0, 1)[0].entry is not None
