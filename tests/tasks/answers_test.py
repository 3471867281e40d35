"""Tests for rl_rewards.tasks.answers (answer extraction)."""

import fractions
import time

from absl.testing import absltest
from absl.testing import parameterized

from rl_rewards.tasks import answers

F = fractions.Fraction


class LastBoxedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("simple", r"so \boxed{5}.", "5"),
      ("nested", r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
      ("last_of_two", r"\boxed{1} or \boxed{2}", "2"),
      ("fbox", r"\fbox{x+1}", "x+1"),
      ("space_form", r"is $\boxed 5$", "5"),
      ("space_then_brace", r"\boxed {7}", "7"),
      ("unbalanced", r"\boxed{\frac{1}{2}", None),
      ("absent", "no box", None),
      ("no_brace", r"\boxed", None),
  )
  def test_cases(self, text, expected):
    self.assertEqual(answers.last_boxed(text), expected)

  def test_deep_nesting_is_linear(self):
    text = r"\boxed{" + "{" * 200_000 + "}" * 200_000 + "}"
    start = time.perf_counter()
    self.assertEqual(answers.last_boxed(text),
                     "{" * 200_000 + "}" * 200_000)
    self.assertLess(time.perf_counter() - start, 2.0)
    self.assertEqual(answers.max_brace_depth("{(a)[[b]]}"), 3)


class NumberTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("commas", "1,000", F(1000)),
      ("negative", "-3", F(-3)),
      ("decimal", "2.50", F(5, 2)),
      ("dollar", "$5", F(5)),
      ("trailing_period", "18.", F(18)),
      ("leading_dot", ".5", F(1, 2)),
      ("percent", "50%", F(50)),
      ("words", "five", None),
      ("two_numbers", "3 4", None),
      ("too_long", "9" * 100, None),
      ("empty", "", None),
  )
  def test_parse_number(self, text, expected):
    self.assertEqual(answers.parse_number(text), expected)

  @parameterized.named_parameters(
      ("marker", "so 3+4=7\n#### 7", F(7)),
      ("marker_wins", "\\boxed{9} #### 1,200 apples", F(1200)),
      ("boxed", "The answer is $\\boxed{2.5}$.", F(5, 2)),
      ("last_number", "First 3 then 4, so 12 total.", F(12)),
      ("none", "no digits here", None),
      ("empty_marker", "####", None),
  )
  def test_prediction_number(self, text, expected):
    self.assertEqual(answers.gsm8k_prediction_number(text), expected)

  def test_gsm8k_final_answer(self):
    self.assertEqual(answers.gsm8k_final_answer("a\n#### 72 "), "72")
    self.assertIsNone(answers.gsm8k_final_answer("72"))


if __name__ == "__main__":
  absltest.main()
