"""Tests for rl_rewards.tasks.reasoning_gym_tasks."""

from absl.testing import absltest
from absl.testing import parameterized

from rl_rewards.tasks import arith
from rl_rewards.tasks import reasoning_gym_tasks


class ExpressionToProblemTest(parameterized.TestCase):

  def test_chain(self):
    problem = reasoning_gym_tasks.expression_to_problem("57 + 87 - 70")
    # Widest number 2 digits, widest running value 144 -> 3 digits.
    self.assertEqual(problem.question, "57+87-70=")
    self.assertEqual(problem.values, (57, 144, 74))
    self.assertEqual(arith.reference_solution(problem),
                     "057+87=144\n144-70=074\n#074")
    problem = reasoning_gym_tasks.expression_to_problem(
        "57 + 87 - 70", fixed_width=False)
    self.assertEqual(arith.reference_solution(problem),
                     "57+87=144\n144-70=74\n#74")

  @parameterized.named_parameters(
      ("negative_running_value", "4 - 1 - 7"),
      ("negative_literal", "2 - -1"),
      ("product", "3 * 4 + 1"),
      ("parentheses", "( 5 + 3 ) - 2"),
      ("single_number", "5"),
      ("empty", ""),
  )
  def test_not_a_chain(self, expression):
    self.assertIsNone(reasoning_gym_tasks.expression_to_problem(expression))


class ReasoningGymTaskTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = reasoning_gym_tasks.ReasoningGymTask("chain_sum", size=40,
                                                    seed=0)

  def test_records_are_the_seeded_dataset_entries(self):
    # Against reasoning-gym's own dataset of the same seed, and the answer
    # against the expression evaluated here.
    import reasoning_gym  # pylint: disable=g-import-not-at-top
    dataset = reasoning_gym.create_dataset("chain_sum", size=40, seed=0)
    for index in (0, 5, 39):
      record = self.task.record(index)
      self.assertEqual(record.index, index)
      self.assertEqual(record.question, dataset[index]["question"])
      expression = dataset[index]["metadata"]["expression"]
      self.assertIn(expression, record.question)
      total, sign = 0, 1
      for token in expression.split():
        if token in "+-":
          sign = 1 if token == "+" else -1
        else:
          total += sign * int(token)
      self.assertEqual(record.answer, str(total))
    # Another seed is another dataset.
    other = reasoning_gym_tasks.ReasoningGymTask("chain_sum", size=40, seed=1)
    self.assertNotEqual([other.record(i).question for i in range(5)],
                        [self.task.record(i).question for i in range(5)])
    with self.assertRaisesRegex(ValueError, "out of range"):
      self.task.record(40)

  def test_score_is_thresholded(self):
    record = self.task.record(0)
    self.assertEqual(self.task.score(record.answer, 0), 1.0)
    self.assertEqual(self.task.score(None, 0), 0.0)
    partial = f"it is {record.answer}"
    self.assertBetween(
        self.task.dataset.score_answer(partial, record.entry), 0.01, 0.99)
    self.assertEqual(self.task.score(partial, 0), 0.0)
    lenient = reasoning_gym_tasks.ReasoningGymTask("chain_sum", size=40,
                                                   seed=0, threshold=0.01)
    self.assertEqual(lenient.score(partial, 0), 1.0)

  def test_entries_convert_to_checkable_problems(self):
    converted = 0
    for i in range(len(self.task)):
      record = self.task.record(i)
      problem = reasoning_gym_tasks.entry_to_problem(record.entry)
      if problem is None:
        continue
      converted += 1
      self.assertEqual(str(problem.answer), record.answer)
      result = arith.check_solution(problem,
                                    arith.reference_solution(problem))
      self.assertEqual(result.first_error, -1)
      self.assertTrue(result.answer_correct)
    self.assertGreater(converted, 10)

  def test_unknown_name(self):
    with self.assertRaisesRegex(ValueError, "close names.*chain_sum"):
      reasoning_gym_tasks.ReasoningGymTask("chainsum", size=3)


if __name__ == "__main__":
  absltest.main()
