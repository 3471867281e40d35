"""Tests for rl_rewards.tasks.verifiers (limits, pool, batch API)."""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from rl_rewards.tasks import verifiers

_HUGE_NUMBER = "9" * 1_000_000
_NESTED = "{" * 10_000 + "1" + "}" * 10_000
_SHALLOW_NESTED = r"\boxed{" + "{" * 500 + "1" + "}" * 500 + "}"


def _uninterruptible_sleep(prediction, reference):
  """Ignores the worker's alarm, like a call stuck in C code."""
  del reference
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
  time.sleep(float(prediction))
  return 1.0


def _misbehave(prediction, reference):
  """Scores like exact match, except on the commands below."""
  if prediction == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
  if prediction == "segfault":
    ctypes.string_at(0)  # Reads address 0: SIGSEGV.
  if prediction == "exit":
    os._exit(3)  # pylint: disable=protected-access
  if prediction == "hang":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
  if prediction == "spin":
    while True:  # Interruptible: the alarm stops it.
      pass
  if prediction == "raise":
    raise RuntimeError("scorer bug")
  if prediction == "nan":
    return float("nan")
  if prediction == "pid":
    return os.getpid() % 2
  if prediction == "swallow":
    try:
      while True:
        pass
    except BaseException:  # pylint: disable=broad-except
      pass  # The alarm, lost as in a garbage-collection callback.
    while True:
      pass
  if prediction == "jax loaded":
    return float("jax" in sys.modules)
  return float(prediction == reference)


class StatsTest(absltest.TestCase):

  def test_add(self):
    total = (verifiers.VerifierStats(1, 2, 3, 4, 5, 6, 0.5) +
             verifiers.VerifierStats(10, 20, 30, 40, 50, 60, 0.25))
    self.assertEqual(total, verifiers.VerifierStats(11, 22, 33, 44, 55, 66))
    self.assertEqual(total.max_call_s, 0.5)
    self.assertEqual(total.as_dict("verifier/")["verifier/oversize"], 44)
    self.assertEqual(total.as_dict("verifier/")["verifier/crashes"], 55)


class InProcessTest(parameterized.TestCase):

  def test_exact(self):
    scores, stats = verifiers.verify_batch(
        "exact", [" 42\n", "42.0", None], ["42", "42", "42"])
    np.testing.assert_array_equal(scores, [1, 0, 0])
    self.assertEqual(stats, verifiers.VerifierStats(calls=3))

  def test_gsm8k(self):
    predictions = ["so #### 1,000", "$2.50", "The answer is -3.",
                   "#### 71", "no number", r"\boxed{18}"]
    references = ["step\n#### 1000", "2.5", "#### -3", "#### 72", "#### 5",
                  "18"]
    scores, stats = verifiers.verify_batch("gsm8k", predictions, references)
    np.testing.assert_array_equal(scores, [1, 1, 1, 0, 0, 1])
    self.assertEqual(stats.errors, 0)

  def test_gsm8k_bad_reference_is_counted(self):
    scores, stats = verifiers.verify_batch("gsm8k", ["1"], ["#### many"])
    np.testing.assert_array_equal(scores, [0])
    self.assertEqual(stats.errors, 1)

  @parameterized.named_parameters(("exact", "exact"), ("gsm8k", "gsm8k"))
  def test_pathological_inputs_score_zero_fast(self, kind):
    predictions = [_HUGE_NUMBER, _NESTED, "#### " + "9" * 9_000,
                   "1," * 4_000 + "1", "#### 5"]
    references = ["#### 5"] * 5
    start = time.perf_counter()
    scores, stats = verifiers.verify_batch(kind, predictions, references)
    self.assertLess(time.perf_counter() - start, 1.0)
    self.assertEqual(scores.tolist()[:4], [0, 0, 0, 0])
    self.assertEqual(stats.oversize, 2)
    self.assertEqual(stats.calls, 5)
    self.assertEqual(scores[4], 1.0)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "kind must be one of"):
      verifiers.verify_batch("fuzzy", [], [])
    with self.assertRaisesRegex(ValueError, "2 predictions but 1"):
      verifiers.verify_batch("exact", ["a", "b"], ["a"])
    with self.assertRaisesRegex(ValueError, "reference 1: gsm8k references "
                                "must be str, got int"):
      verifiers.verify_batch("gsm8k", ["1", "2"], ["1", 2])

  @parameterized.named_parameters(("exact", "exact"), ("gsm8k", "gsm8k"),
                                  ("math", "math"))
  def test_predictions_of_the_wrong_type_are_counted(self, kind):
    # Never sent to a worker, so no pool is started for "math".
    predictions = [b"42", 42, 42.0, ["42"], {"a": 1}, bytearray(b"4"), None]
    scores, stats = verifiers.verify_batch(kind, predictions, ["42"] * 7)
    np.testing.assert_array_equal(scores, np.zeros(7))
    self.assertEqual((stats.calls, stats.wrong_type, stats.errors), (7, 6, 0))

  def test_max_call_seconds_is_recorded(self):
    _, stats = verifiers.verify_batch("gsm8k", ["1," * 4_000 + "1"],
                                      ["#### 1"])
    self.assertGreater(stats.max_call_s, 0.0)
    self.assertLess(stats.max_call_s, 0.5)


class PooledTest(parameterized.TestCase):
  """Uses one shared pool; starting workers and imports take seconds."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = verifiers.VerifierPool(num_workers=2)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def test_math_verify(self):
    predictions = [r"\boxed{\frac{1}{2}}", "0.5", r"\boxed{3}", None,
                   "x = 2", r"$\boxed{\{1,2\}}$"]
    references = [r"$\frac{1}{2}$", "1/2", "4", "4", "$2$", r"$\{2,1\}$"]
    scores, stats = verifiers.verify_batch("math", predictions, references,
                                           pool=self.pool)
    np.testing.assert_array_equal(scores, [1, 1, 0, 0, 1, 1])
    self.assertEqual((stats.timeouts, stats.errors, stats.oversize), (0, 0, 0))

  def test_math_pathological_inputs_score_zero_within_limit(self):
    predictions = [
        _HUGE_NUMBER,                      # oversize
        _NESTED,                           # oversize (too deep and long)
        _SHALLOW_NESTED,                   # nesting over the depth limit
        r"\boxed{10^{10^{10^{10}}}}",      # sympy power tower: hangs
        "9^9^9^9",                         # ditto
        r"\boxed{2}",                      # a normal one still works
    ]
    references = ["1"] * 5 + ["2"]
    start = time.perf_counter()
    scores, stats = verifiers.verify_batch(
        "math", predictions, references, timeout_s=1.0, pool=self.pool)
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(scores, [0, 0, 0, 0, 0, 1])
    self.assertEqual(stats.oversize, 3)
    self.assertEqual(stats.timeouts, 2)
    self.assertLess(elapsed, 15.0)

  def test_deadline_kills_stuck_workers(self):
    items = [(0, "30", None), (1, "0", None), (2, "0", None)]
    start = time.perf_counter()
    scores, timeouts, errors = self.pool.run(
        _uninterruptible_sleep, items, timeout_s=0.5)
    self.assertLess(time.perf_counter() - start, 10.0)
    self.assertEqual(scores, {0: 0.0, 1: 1.0, 2: 1.0})
    self.assertEqual((timeouts, errors), (1, 0))
    self.assertEqual(self.pool.restarts, 1)
    # The pool restarts on the next call.
    scores, _ = verifiers.verify_batch("math", ["3"], ["3"], pool=self.pool)
    np.testing.assert_array_equal(scores, [1])

  def test_crashed_workers_lose_only_their_call_and_are_replaced(self):
    pool = verifiers.VerifierPool(num_workers=2)
    try:
      items = [(0, "a", "a"), (1, "sigkill", "x"), (2, "b", "b"),
               (3, "segfault", "x"), (4, "c", "x"), (5, "exit", "x"),
               (6, "d", "d"), (7, "e", "e")]
      results = pool.run_detailed(_misbehave, items, timeout_s=5.0)
      self.assertEqual({p: r.status for p, r in results.items()},
                       {0: "ok", 1: "crash", 2: "ok", 3: "crash", 4: "ok",
                        5: "crash", 6: "ok", 7: "ok"})
      self.assertEqual({p: r.score for p, r in results.items()},
                       {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 5: 0, 6: 1, 7: 1})
      self.assertEqual(pool.restarts, 3)
      # A worker lost after the queue ran dry is replaced when work comes
      # (whether that happened here depends on timing), never more than
      # num_workers live at once.
      self.assertLessEqual(len(pool.worker_pids()), 2)
      # The next calls work, in live workers: the pool is back to 2.
      scores, timeouts, errors = pool.run(
          _misbehave, [(0, "x", "x"), (1, "raise", "x"), (2, "nan", "x")],
          timeout_s=5.0)
      self.assertEqual((scores, timeouts, errors), ({0: 1, 1: 0, 2: 0}, 0, 2))
      self.assertLen(pool.worker_pids(), 2)
      self.assertEqual(pool.restarts, 3)
    finally:
      pool.close()

  def test_hung_and_spinning_calls_are_stopped_within_the_limit(self):
    pool = verifiers.VerifierPool(num_workers=2)
    try:
      items = [(0, "hang", "x"), (1, "spin", "x"), (2, "a", "a"),
               (3, "hang", "x"), (4, "b", "b"), (5, "c", "c")]
      start = time.perf_counter()
      results = pool.run_detailed(_misbehave, items, timeout_s=0.5)
      elapsed = time.perf_counter() - start
      self.assertEqual([results[p].status for p in range(6)],
                       ["timeout", "timeout", "ok", "timeout", "ok", "ok"])
      self.assertEqual([results[p].score for p in range(6)],
                       [0, 0, 1, 0, 1, 1])
      # The alarm stops the spinning call; the hung ones are killed.
      self.assertLess(results[1].seconds, 0.5 + 0.4)
      for p in (0, 3):
        self.assertLess(results[p].seconds,
                        0.5 + verifiers.KILL_GRACE_S + 0.5)
      self.assertEqual(pool.restarts, 2)
      self.assertLess(elapsed, 15.0)
      scores, _, _ = pool.run(_misbehave, [(0, "y", "y")], timeout_s=0.5)
      self.assertEqual(scores, {0: 1.0})
    finally:
      pool.close()

  def test_a_worker_killed_while_idle_is_replaced(self):
    pool = verifiers.VerifierPool(num_workers=1)
    try:
      pool.run(_misbehave, [(0, "a", "a")], timeout_s=5.0)
      (pid,) = pool.worker_pids()
      os.kill(pid, signal.SIGKILL)
      time.sleep(0.2)
      scores, timeouts, errors = pool.run(_misbehave, [(0, "a", "a")],
                                          timeout_s=5.0)
      self.assertEqual((scores, timeouts, errors), ({0: 1.0}, 0, 0))
      self.assertNotEqual(pool.worker_pids(), [pid])
    finally:
      pool.close()

  def test_close_leaves_no_worker_processes(self):
    pool = verifiers.VerifierPool(num_workers=2)
    pool.run(_misbehave, [(0, "pid", "x"), (1, "hang", "x")], timeout_s=0.3)
    pids = pool.worker_pids()
    self.assertLen(pids, 1)  # The hung one was killed and not yet replaced.
    self.assertContainsSubset(pids, verifiers.live_worker_pids())
    pool.close()
    self.assertEqual(pool.worker_pids(), [])
    self.assertFalse(set(pids) & set(verifiers.live_worker_pids()))
    for pid in pids:  # Stopped and reaped.
      with self.assertRaises(ProcessLookupError):
        os.kill(pid, 0)

  def test_a_lost_alarm_is_followed_by_another(self):
    pool = verifiers.VerifierPool(num_workers=1)
    try:
      results = pool.run_detailed(_misbehave, [(0, "swallow", "x")],
                                  timeout_s=0.5)
      self.assertEqual(results[0].status, "timeout")
      self.assertLess(results[0].seconds, 0.5 + 0.4)
      self.assertEqual(pool.restarts, 0)  # Stopped by the alarm, not killed.
    finally:
      pool.close()

  def test_workers_do_not_import_the_callers_program(self):
    # A program (its main module imports jax, like experiments/train.py)
    # asks a worker whether jax is loaded there.
    directory = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, directory)
    program = os.path.join(directory, "program.py")
    with open(program, "w") as f:
      f.write(textwrap.dedent("""
          import sys
          import jax  # The program's own heavy imports.
          sys.path[:0] = {path!r}
          import verifiers_test
          from rl_rewards.tasks import verifiers
          if __name__ == "__main__":
            pool = verifiers.VerifierPool(num_workers=1)
            scores, _, _ = pool.run(verifiers_test._misbehave,
                                    [(0, "jax loaded", "x")], timeout_s=30.0)
            pool.close()
            print("worker has jax:", scores[0])
          """).format(path=sys.path))
    result = subprocess.run([sys.executable, program], capture_output=True,
                            text=True, timeout=120, check=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertIn("worker has jax: 0.0", result.stdout)

  def test_a_missing_library_is_a_clear_error(self):
    pool = verifiers.VerifierPool(num_workers=1)
    with self.assertRaisesRegex(RuntimeError, "cannot import .*"
                                "no_such_verifier_library"):
      pool.run(_misbehave, [(0, "a", "a")], timeout_s=1.0,
               modules=("no_such_verifier_library",))
    self.assertEqual(pool.worker_pids(), [])

  def test_reasoning_gym(self):
    # Imported here: pool workers import this module, and should stay light.
    # pylint: disable-next=g-import-not-at-top
    from rl_rewards.tasks import reasoning_gym_tasks
    task = reasoning_gym_tasks.ReasoningGymTask("chain_sum", size=4, seed=3)
    gold = [task.record(i).answer for i in range(4)]
    wrong = f"maybe {gold[1]}"
    scores, stats = task.score_batch(
        [gold[0], wrong, "x" * 20_000, None], range(4), pool=self.pool)
    # An answer that contains the gold one gets partial credit from
    # reasoning-gym; thresholded to 0.
    self.assertGreater(task.dataset.score_answer(wrong, task.record(1).entry),
                       0.0)
    np.testing.assert_array_equal(scores, [1, 0, 0, 0])
    self.assertEqual(stats.oversize, 1)


if __name__ == "__main__":
  absltest.main()
