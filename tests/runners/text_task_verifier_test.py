"""The text task's outcome rewards: hostile responses score 0 and are
counted and logged; training goes on."""

from absl import logging
import numpy as np

from rl_rewards.runners import rl_metrics
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import verifiers


def _gsm8k_task():
  # The verifier path only: no data files or tokenizer are needed.
  task = object.__new__(tasks_lib.TextTask)
  task.kind, task.delimiter, task.verifier_timeout_s = "gsm8k", "\n", 1.0
  task.last_verifier_stats = verifiers.VerifierStats()
  task.verifier_stats_total = verifiers.VerifierStats()
  return task


def test_hostile_responses_are_counted_and_logged(monkeypatch):
  task = _gsm8k_task()
  problems = [tasks_lib.TextProblem("Q", "7", "#### 7", i) for i in range(3)]
  warnings = []
  monkeypatch.setattr(logging, "warning",
                      lambda fmt, *args: warnings.append(fmt % args))
  scored = task.score(problems, ["#### 7", "9" * 1_000_000, "#### 7"],
                      [True, True, False])
  np.testing.assert_array_equal(scored.rewards, [1, 0, 0])
  assert task.last_verifier_stats.oversize == 1
  assert len(warnings) == 1
  assert "verifier gsm8k: {'oversize': 1} of 3 calls" in warnings[0]
  task.score(problems[:1], ["{" * 500], [True])
  assert task.verifier_stats_total.calls == 4
  assert task.verifier_stats_total.oversize == 2
  assert "since the start: {'calls': 4, " in warnings[1]
  task.score(problems[:1], ["#### 7"], [True])  # Nothing to report.
  assert len(warnings) == 2


def test_rl_step_records_the_verifier_counts():
  task = _gsm8k_task()
  problems = [tasks_lib.TextProblem("Q", "7", "#### 7", i) for i in range(2)]
  task.score(problems, ["#### 7", "9" * 1_000_000], [True, True])
  got = rl_metrics.verifier_metrics(task)
  assert got["verifier/calls"] == 2
  assert got["verifier/oversize"] == 1
  assert got["verifier/timeouts"] == 0
  assert "verifier/max_call_s" in got
  # The arithmetic task checks answers in-process: nothing to record.
  assert rl_metrics.verifier_metrics(object()) == {}
