"""Tests for rl_rewards.tasks.arith: generator, checker and corruptions."""

import collections
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from rl_rewards.tasks import arith

CFG = arith.ArithConfig()


def _hand_problem(fixed_width=True):
  # 23 + 7 - 15: running values 23, 30, 15.
  return arith.problem_from_chain(23, "+-", [7, 15], fixed_width=fixed_width)


def _reference_labels(problem, text):
  """The checker's rules, written with string methods instead of a regex."""
  steps = text.split("\n")
  if len(steps) > 1 and steps[-1] == "":
    steps = steps[:-1]

  def number(s):
    if not s or len(s) > 9 or any(c not in "0123456789" for c in s):
      return None
    return int(s)

  labels = []
  for j, step in enumerate(steps):
    if j < problem.num_ops:
      ok = False
      if step.count("=") == 1:
        left, right = step.split("=")
        op_positions = [i for i, c in enumerate(left) if c in "+-"]
        if len(op_positions) == 1:
          i = op_positions[0]
          a, b, c = number(left[:i]), number(left[i + 1:]), number(right)
          op = left[i]
          if None not in (a, b, c):
            expected = a + b if op == "+" else a - b
            ok = (a == problem.values[j] and op == problem.ops[j] and
                  b == problem.operands[j] and c == expected)
      labels.append(ok)
    elif j == problem.num_ops:
      labels.append(step.startswith("#") and
                    number(step[1:]) == problem.answer)
    else:
      labels.append(False)
  last = steps[-1]
  answer_correct = last.startswith("#") and number(last[1:]) == problem.answer
  return labels, answer_correct


class ConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("ops", dict(min_ops=3, max_ops=2), "min_ops"),
      ("first", dict(first_max=300), "first_max"),
      ("prob", dict(small_operand_prob=1.5), "small_operand_prob"),
      ("operand", dict(small_operand_min=0), "small_operand_min"),
  )
  def test_invalid_config(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      arith.ArithConfig(**kwargs)

  def test_widths(self):
    self.assertEqual((CFG.operand_width, CFG.value_width), (2, 3))


class FormatTest(absltest.TestCase):

  def test_fixed_width(self):
    problem = _hand_problem()
    self.assertEqual(problem.question, "23+07-15=")
    self.assertEqual(problem.values, (23, 30, 15))
    self.assertEqual(problem.answer, 15)
    self.assertEqual(arith.reference_solution(problem),
                     "023+07=030\n030-15=015\n#015")

  def test_variable_width(self):
    problem = _hand_problem(fixed_width=False)
    self.assertEqual(problem.question, "23+7-15=")
    self.assertEqual(arith.reference_solution(problem),
                     "23+7=30\n30-15=15\n#15")

  def test_bad_chain(self):
    with self.assertRaisesRegex(ValueError, "running values"):
      arith.problem_from_chain(5, "-", [7])
    with self.assertRaisesRegex(ValueError, "ops must be"):
      arith.problem_from_chain(5, "*", [7])


class GeneratorTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.train = arith.make_problems(CFG, "train", range(3000))

  def test_deterministic_function_of_seed_split_index(self):
    self.assertEqual(arith.make_problem(CFG, 17, "train"), self.train[17])
    self.assertEqual(arith.make_problem(CFG, 17, "eval"),
                     arith.make_problem(CFG, 17, "eval"))
    other_seed = arith.ArithConfig(seed=1)
    self.assertNotEqual(arith.make_problem(other_seed, 17).question,
                        self.train[17].question)
    self.assertGreater(len({p.question for p in self.train}), 2900)

  def test_splits_are_disjoint(self):
    train = {(p.values[0], p.ops, p.operands) for p in self.train}
    for split in ("eval", "test"):
      heldout = {(p.values[0], p.ops, p.operands)
                 for p in arith.make_problems(CFG, split, range(1000))}
      self.assertEmpty(train & heldout)
    # Small problem spaces make collisions likely without the split rule.
    small = arith.ArithConfig(min_ops=2, max_ops=2, small_operand_prob=1.0,
                              first_max=9)
    train = {p.question for p in arith.make_problems(small, "train",
                                                     range(2000))}
    heldout = {p.question for p in arith.make_problems(small, "eval",
                                                       range(500))}
    self.assertEmpty(train & heldout)
    self.assertGreater(len(heldout), 50)

  def test_distribution(self):
    counts = collections.Counter(p.num_ops for p in self.train)
    self.assertEqual(set(counts), {2, 3, 4, 5, 6})
    self.assertGreater(min(counts.values()), 450)  # ~600 each.
    operands = [b for p in self.train for b in p.operands]
    firsts = [p.values[0] for p in self.train]
    self.assertTrue(all(1 <= b <= 99 for b in operands))
    self.assertTrue(all(1 <= x <= 99 for x in firsts))
    self.assertTrue(all(0 <= v <= 199 for p in self.train for v in p.values))
    # Resampling to stay in range biases these a little; loose bounds.
    small_fraction = np.mean([b <= 9 for b in operands])
    plus_fraction = np.mean([op == "+" for p in self.train for op in p.ops])
    self.assertBetween(small_fraction, 0.25, 0.40)
    self.assertBetween(plus_fraction, 0.4, 0.6)

  def test_reference_solutions_check_correct(self):
    for problem in self.train[:500]:
      result = arith.check_solution(problem,
                                    arith.reference_solution(problem))
      self.assertEqual(result.labels, [True] * (problem.num_ops + 1))
      self.assertEqual(result.first_error, -1)
      self.assertTrue(result.answer_correct)
      self.assertEqual(arith.outcome_reward(
          problem, arith.reference_solution(problem), finished=True), 1.0)


class CheckSolutionTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("correct", "023+07=030\n030-15=015\n#015", [1, 1, 1], -1, True),
      ("no_padding", "23+7=30\n30-15=15\n#15", [1, 1, 1], -1, True),
      ("extra_zeros", "0023+007=30\n30-15=0015\n#0015", [1, 1, 1], -1, True),
      ("trailing_newline", "023+07=030\n030-15=015\n#015\n", [1, 1, 1], -1,
       True),
      ("wrong_sum", "023+07=031\n031-15=016\n#016", [0, 0, 0], 0, False),
      # Step 1 copies the wrong running value but is internally consistent.
      ("wrong_carry", "023+07=030\n031-15=016\n#016", [1, 0, 0], 1, False),
      ("wrong_operand", "023+08=031\n031-15=016\n#016", [0, 0, 0], 0, False),
      ("wrong_op", "023-07=016\n016-15=001\n#001", [0, 0, 0], 0, False),
      ("wrong_answer", "023+07=030\n030-15=015\n#016", [1, 1, 0], 2, False),
      ("missing_step", "023+07=030\n#015", [1, 0], 1, True),
      ("extra_step", "023+07=030\n030-15=015\n015+00=015\n#015", [1, 1, 0, 0],
       2, True),
      ("empty_step", "023+07=030\n\n030-15=015\n#015", [1, 0, 0, 0], 1, True),
      ("prefix_only", "023+07=030", [1], -1, False),
      ("empty", "", [0], 0, False),
      ("spaces", "023 + 07 = 030\n030-15=015\n#015", [0, 1, 1], 0, True),
      ("unicode_digits", "\u0662\u0663+07=030\n030-15=015\n#015", [0, 1, 1],
       0, True),
      ("double_equals", "023+07=030=030\n030-15=015\n#015", [0, 1, 1], 0,
       True),
      ("answer_no_hash", "023+07=030\n030-15=015\n015", [1, 1, 0], 2, False),
      ("answer_after_more", "023+07=030\n030-15=015\n#015\n#015",
       [1, 1, 1, 0], 3, True),
  )
  def test_hand_cases(self, text, labels, first_error, answer_correct):
    result = arith.check_solution(_hand_problem(), text)
    self.assertEqual(result.labels, [bool(x) for x in labels])
    self.assertEqual(result.first_error, first_error)
    self.assertEqual(result.answer_correct, answer_correct)
    self.assertEqual(result.num_steps, len(labels))

  def test_outcome_reward_needs_finished(self):
    problem = _hand_problem()
    text = arith.reference_solution(problem)
    self.assertEqual(arith.outcome_reward(problem, text, finished=False), 0.0)
    self.assertEqual(arith.outcome_reward(problem, text + "9", True), 0.0)

  def test_matches_string_reference_on_fuzzed_responses(self):
    rng = np.random.default_rng(0)
    problems = arith.make_problems(CFG, "eval", range(300))
    edits = list("0123456789+-=#\n ") + ["", "\n\n", "00"]
    for problem in problems:
      text = arith.reference_solution(problem)
      for _ in range(4):
        chars = list(text)
        for _ in range(rng.integers(1, 3)):
          position = int(rng.integers(0, len(chars) + 1))
          edit = edits[rng.integers(0, len(edits))]
          if rng.random() < 0.5 and position < len(chars):
            chars[position] = edit
          else:
            chars.insert(position, edit)
        mutated = "".join(chars)
        result = arith.check_solution(problem, mutated)
        labels, answer_correct = _reference_labels(problem, mutated)
        self.assertEqual(result.labels, labels, repr(mutated))
        self.assertEqual(result.answer_correct, answer_correct, repr(mutated))

  def test_adversarial_inputs_never_raise_and_stay_fast(self):
    problem = _hand_problem()
    rng = np.random.default_rng(1)
    texts = [
        "9" * 1_000_000,
        "1" * 500 + "+" + "2" * 500 + "=" + "3" * 500,
        "\n" * 200_000,
        ("023+07=030\n" * 50_000),
        "+" * 100_000 + "=" * 100_000,
        "#" + "0" * 100_000 + "15",
        "".join(chr(c) for c in rng.integers(0, 0x10FFFF, 20_000)
                if not 0xD800 <= c <= 0xDFFF),
    ]
    start = time.perf_counter()
    for text in texts:
      result = arith.check_solution(problem, text)
      self.assertLen(result.labels, result.num_steps)
      self.assertFalse(result.answer_correct)
    # Linear-time parsing: a hang or a regex blow-up would take minutes.
    self.assertLess(time.perf_counter() - start, 10.0)


class CorruptSolutionTest(parameterized.TestCase):

  @parameterized.parameters(*arith.CORRUPTION_KINDS)
  def test_checker_finds_known_first_error(self, kind):
    rng = np.random.default_rng(2)
    for problem in arith.make_problems(CFG, "eval", range(200)):
      corrupted = arith.corrupt_solution(problem, rng, kind)
      result = arith.check_solution(problem, corrupted.text)
      self.assertEqual(result.first_error, corrupted.first_error,
                       (problem.question, corrupted.text))
      self.assertNotEqual(corrupted.first_error, -1)
      if kind == "answer":
        self.assertEqual(corrupted.first_error, problem.num_ops)
      if kind != "skip":  # Skipping an op changes the step count.
        self.assertEqual(result.num_steps, problem.num_ops + 1)
      # Every kind changes the final value.
      self.assertFalse(result.answer_correct)

  def test_error_position_is_spread(self):
    rng = np.random.default_rng(3)
    problem = arith.problem_from_chain(50, "+-+-", [10, 20, 5, 7])
    positions = {arith.corrupt_solution(problem, rng, "arithmetic").first_error
                 for _ in range(100)}
    self.assertEqual(positions, {0, 1, 2, 3})

  def test_skip_of_repeated_operation(self):
    # Skipping either "+5" of "1+5+5-2" writes the same first line as the
    # reference; the first wrong line is the second one.
    problem = arith.problem_from_chain(1, "++-", [5, 5, 2])
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(40):
      corrupted = arith.corrupt_solution(problem, rng, "skip")
      seen.add(corrupted.text)
      self.assertEqual(
          arith.check_solution(problem, corrupted.text).first_error,
          corrupted.first_error)
    self.assertIn("001+05=006\n006-02=004\n#004", seen)

  def test_unknown_kind(self):
    with self.assertRaisesRegex(ValueError, "kind must be one of"):
      arith.corrupt_solution(_hand_problem(), np.random.default_rng(0), "x")


if __name__ == "__main__":
  absltest.main()
