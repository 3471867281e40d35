"""Tests for rl_rewards.tasks.verifiers (limits, pool, batch API)."""

import signal
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


class StatsTest(absltest.TestCase):

  def test_add(self):
    total = (verifiers.VerifierStats(1, 2, 3, 4) +
             verifiers.VerifierStats(10, 20, 30, 40))
    self.assertEqual(total, verifiers.VerifierStats(11, 22, 33, 44))
    self.assertEqual(total.as_dict("verifier/")["verifier/oversize"], 44)


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
