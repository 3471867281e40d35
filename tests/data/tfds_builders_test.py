"""End-to-end tests of rl_rewards.data.builders (tfds, array_record, no TF).

All builders share one data_dir per test class, and datasets are tiny: the
tfds import (~1 s) and preparation (~0.1 s each) dominate.
"""

import json
import os
import shutil
import tempfile

from absl.testing import absltest

from rl_rewards.data import builders
from rl_rewards.data import pipeline
from rl_rewards.tasks import arith
from rl_rewards.tasks import tokenizer as tokenizer_lib


def _write_jsonl(path, objects):
  with open(path, "w", encoding="utf-8") as f:
    for obj in objects:
      f.write(obj if isinstance(obj, str) else json.dumps(obj))
      f.write("\n")
  return path


class BuildersTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.data_dir = os.path.join(cls.dir, "tfds")

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def test_gsm8k_jsonl_round_trip_in_file_order(self):
    objects = [{"question": f"Q{i}?", "answer": f"work\n#### {i},000"}
               for i in range(7)]
    train = _write_jsonl(os.path.join(self.dir, "g_train.jsonl"), objects)
    test = _write_jsonl(os.path.join(self.dir, "g_test.jsonl"), objects[:2])
    builder = builders.gsm8k_jsonl({"train": train, "test": test},
                                   self.data_dir)
    source = builders.data_source(builder, "train")
    self.assertLen(source, 7)
    for i in range(7):
      record = source[i]
      self.assertEqual(record["question"], f"Q{i}?".encode())
      self.assertEqual(record["answer"], f"{i},000".encode())
      self.assertEqual(record["solution"], objects[i]["answer"].encode())
      self.assertEqual(int(record["index"]), i)
    self.assertLen(builders.data_source(builder, "test"), 2)
    with self.assertRaisesRegex(ValueError, "split 'eval' not in"):
      builders.data_source(builder, "eval")

  def test_changed_file_is_prepared_again(self):
    path = os.path.join(self.dir, "changing.jsonl")
    _write_jsonl(path, [{"question": "A", "answer": "#### 1"}])
    first = builders.gsm8k_jsonl({"train": path}, self.data_dir)
    _write_jsonl(path, [{"question": "B", "answer": "#### 2"}])
    second = builders.gsm8k_jsonl({"train": path}, self.data_dir)
    self.assertNotEqual(first.builder_config.name,
                        second.builder_config.name)
    self.assertEqual(builders.data_source(second, "train")[0]["question"],
                     b"B")

  def test_malformed_jsonl_fails_before_writing(self):
    path = _write_jsonl(os.path.join(self.dir, "bad.jsonl"), [
        {"question": "A", "answer": "#### 1"}, "{not json"])
    with self.assertRaisesRegex(ValueError, r"bad.jsonl:2: invalid JSON"):
      builders.gsm8k_jsonl({"train": path}, self.data_dir)
    with self.assertRaisesRegex(ValueError, "split names"):
      builders.gsm8k_jsonl({"train/x": path}, self.data_dir)

  def test_math_jsonl(self):
    path = _write_jsonl(os.path.join(self.dir, "m.jsonl"), [
        {"problem": "P", "solution": r"So \boxed{\frac{1}{2}}."}])
    builder = builders.math_jsonl({"test": path}, self.data_dir)
    record = builders.data_source(builder, "test")[0]
    self.assertEqual(record["answer"], rb"\frac{1}{2}")
    self.assertEqual(record["question"], b"P")

  def test_arith_records_match_generator(self):
    task = arith.ArithConfig(seed=3)
    builder = builders.arith_problems(task, {"train": 12, "eval": 5},
                                      self.data_dir)
    source = builders.data_source(builder, "eval")
    self.assertLen(source, 5)
    for i in range(5):
      problem = arith.make_problem(task, i, "eval")
      record = source[i]
      self.assertEqual(record["question"].decode(), problem.question)
      self.assertEqual(record["solution"].decode(),
                       arith.reference_solution(problem))
      self.assertEqual(int(record["answer"]), problem.answer)
      self.assertEqual(int(record["num_ops"]), problem.num_ops)
    # The tfds source and the on-demand source give the same batches.
    tok = tokenizer_lib.CharTokenizer()
    from_tfds = pipeline.prompt_dataset(
        builders.data_source(builder, "train"), tok, batch_size=4,
        max_prompt_len=24, seed=5)
    on_demand = pipeline.prompt_dataset(
        pipeline.ArithProblemSource(task, "train", size=12), tok,
        batch_size=4, max_prompt_len=24, seed=5)
    for i in (0, 2, 7):
      for key in ("tokens", "prompt_mask", "question", "answer", "index"):
        self.assertEqual(from_tfds[i][key].tolist(), on_demand[i][key].tolist())

  def test_reasoning_gym_task(self):
    builder = builders.reasoning_gym_task("chain_sum", {"train": 6, "test": 3},
                                          seed=1, data_dir=self.data_dir)
    train = builders.data_source(builder, "train")
    record = train[2]
    metadata = json.loads(record["metadata"])
    self.assertEqual(metadata["source_dataset"], "chain_sum")
    self.assertIn(metadata["expression"].encode(), record["question"])
    self.assertLen(builders.data_source(builder, "test"), 3)
    with self.assertRaisesRegex(ValueError, "unknown reasoning-gym dataset"):
      builders.reasoning_gym_task("no_such_task", {"train": 2}, 0,
                                  self.data_dir)


if __name__ == "__main__":
  absltest.main()
