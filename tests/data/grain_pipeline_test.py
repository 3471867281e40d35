"""Tests for rl_rewards.data.pipeline (grain batches, random access)."""

from absl.testing import absltest
import numpy as np

from rl_rewards.data import pipeline
from rl_rewards.tasks import arith
from rl_rewards.tasks import tokenizer as tokenizer_lib

TOK = tokenizer_lib.CharTokenizer()
TASK = arith.ArithConfig()


def _records(n):
  # Bytes fields, like a tfds data source returns.
  return [{"question": f"{i}+1=".encode(), "answer": str(i + 1).encode(),
           "solution": f"#{i + 1}".encode(), "index": i} for i in range(n)]


class PromptDatasetTest(absltest.TestCase):

  def test_shapes_and_contents(self):
    dataset = pipeline.prompt_dataset(_records(6), TOK, batch_size=3,
                                      max_prompt_len=8, num_epochs=1)
    self.assertLen(dataset, 2)
    batch = dataset[1]
    self.assertEqual(batch["tokens"].shape, (3, 8))
    self.assertEqual(batch["tokens"].dtype, np.int32)
    self.assertEqual(batch["prompt_mask"].shape, (3, 8))
    self.assertEqual(batch["question"].tolist(), ["3+1=", "4+1=", "5+1="])
    self.assertEqual(batch["answer"].tolist(), ["4", "5", "6"])
    self.assertEqual(batch["index"].tolist(), [3, 4, 5])
    expected, _ = tokenizer_lib.encode_prompts(TOK, ["3+1=", "4+1=", "5+1="],
                                               8)
    np.testing.assert_array_equal(batch["tokens"], expected)

  def test_incomplete_batch_dropped(self):
    dataset = pipeline.prompt_dataset(_records(10), TOK, batch_size=4,
                                      max_prompt_len=8, num_epochs=1)
    self.assertLen(dataset, 2)

  def test_epochs_are_reshuffled_permutations(self):
    dataset = pipeline.prompt_dataset(_records(12), TOK, batch_size=4,
                                      max_prompt_len=8, seed=0, num_epochs=2)
    indices = [dataset[i]["index"].tolist() for i in range(len(dataset))]
    first = sum(indices[:3], [])
    second = sum(indices[3:], [])
    self.assertCountEqual(first, range(12))
    self.assertCountEqual(second, range(12))
    self.assertNotEqual(first, second)
    self.assertNotEqual(first, list(range(12)))

  def test_random_access_equals_iteration_and_resume_is_exact(self):
    def make():
      return pipeline.prompt_dataset(_records(12), TOK, batch_size=4,
                                     max_prompt_len=8, seed=7)
    iterated = []
    for i, batch in enumerate(make()):
      iterated.append(batch["index"].tolist())
      if i == 9:
        break
    fresh = make()
    resumed = [fresh[i]["index"].tolist() for i in range(5, 10)]
    self.assertEqual(iterated[5:], resumed)
    other_seed = pipeline.prompt_dataset(_records(12), TOK, batch_size=4,
                                         max_prompt_len=8, seed=8)
    self.assertNotEqual([other_seed[i]["index"].tolist() for i in range(3)],
                        iterated[:3])

  def test_prompt_too_long(self):
    dataset = pipeline.prompt_dataset(_records(4), TOK, batch_size=2,
                                      max_prompt_len=4)
    with self.assertRaisesRegex(ValueError, "max_prompt_len=4"):
      dataset[0]  # pylint: disable=pointless-statement


class ArithSourceTest(absltest.TestCase):

  def test_records(self):
    source = pipeline.ArithProblemSource(TASK, "eval", size=5)
    self.assertLen(source, 5)
    problem = arith.make_problem(TASK, 4, "eval")
    self.assertEqual(source[4], {
        "question": problem.question, "answer": str(problem.answer),
        "solution": arith.reference_solution(problem), "index": 4,
        "num_ops": problem.num_ops})
    with self.assertRaises(IndexError):
      source[5]  # pylint: disable=pointless-statement

  def test_unbounded_training_stream(self):
    source = pipeline.ArithProblemSource(TASK, "train")
    dataset = pipeline.prompt_dataset(source, TOK, batch_size=4,
                                      max_prompt_len=24)
    batch = dataset[1_000_000]
    self.assertEqual(batch["index"].tolist(),
                     [4_000_000, 4_000_001, 4_000_002, 4_000_003])
    self.assertEqual(batch["question"][2],
                     arith.make_problem(TASK, 4_000_002, "train").question)


class SftDatasetTest(absltest.TestCase):

  def test_layout_matches_encode_sft_batch(self):
    source = pipeline.ArithProblemSource(TASK, "train")
    dataset = pipeline.sft_dataset(source, TOK, batch_size=4,
                                   max_prompt_len=24, max_len=96)
    batch = dataset[3]
    problems = arith.make_problems(TASK, "train", range(12, 16))
    expected = tokenizer_lib.encode_sft_batch(
        TOK, [p.question for p in problems],
        [arith.reference_solution(p) for p in problems],
        max_prompt_len=24, max_len=96)
    for key in ("tokens", "loss_mask", "attention_mask"):
      np.testing.assert_array_equal(batch[key], expected[key])
      self.assertEqual(batch[key].shape, (4, 96))
    # The loss covers exactly the solution and EOS.
    targets = batch["tokens"][0][batch["loss_mask"][0] == 1]
    self.assertEqual(targets[-1], TOK.eos_id)
    self.assertEqual(TOK.decode(targets),
                     arith.reference_solution(problems[0]))


if __name__ == "__main__":
  absltest.main()
