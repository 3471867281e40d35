"""Tests for rl_rewards.data.jsonl (GSM8K/MATH readers and their errors)."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from rl_rewards.data import jsonl


class _TempDirTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def write(self, name, lines):
    path = os.path.join(self.dir, name)
    with open(path, "w", encoding="utf-8") as f:
      for line in lines:
        f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


class Gsm8kTest(_TempDirTest):

  def test_reads_records(self):
    path = self.write("train.jsonl", [
        {"question": "Q1", "answer": "3*4=<<3*4=12>>12\n#### 12"},
        "",  # Blank lines are skipped.
        {"question": "Q2", "answer": "So\n#### 1,000", "extra": 1},
    ])
    records = jsonl.read_gsm8k_jsonl(path)
    self.assertEqual(records, [
        {"question": "Q1", "answer": "12",
         "solution": "3*4=<<3*4=12>>12\n#### 12", "index": 0},
        {"question": "Q2", "answer": "1,000", "solution": "So\n#### 1,000",
         "index": 1},
    ])

  @parameterized.named_parameters(
      ("bad_json", '{"question": "Q", "answer": ', r":2: invalid JSON"),
      ("not_object", "[1, 2]", r":2: expected a JSON object"),
      ("missing_field", {"question": "Q"}, r":2: missing field 'answer'"),
      ("wrong_type", {"question": 3, "answer": "#### 1"},
       r":2: field 'question' must be a string"),
      ("no_marker", {"question": "Q", "answer": "the answer is 5"},
       r":2: field 'answer' has no '#### '"),
      ("empty_final", {"question": "Q", "answer": "#### "},
       r":2: the final answer after '#### ' is empty"),
  )
  def test_malformed_line_names_file_and_line(self, bad_line, message):
    path = self.write("bad.jsonl", [
        {"question": "Q0", "answer": "#### 0"}, bad_line])
    with self.assertRaisesRegex(ValueError, "bad.jsonl" + message):
      jsonl.read_gsm8k_jsonl(path)

  def test_missing_and_empty_files(self):
    with self.assertRaisesRegex(ValueError, "nope.jsonl: file not found"):
      jsonl.read_gsm8k_jsonl(os.path.join(self.dir, "nope.jsonl"))
    with self.assertRaisesRegex(ValueError, "empty.jsonl: no records"):
      jsonl.read_gsm8k_jsonl(self.write("empty.jsonl", [""]))


class MathTest(_TempDirTest):

  def test_reads_boxed_answer_with_nested_braces(self):
    path = self.write("test.jsonl", [
        {"problem": "P1", "solution": r"So $\boxed{\frac{1}{2}}$.",
         "level": "Level 2"},
        {"problem": "P2", "solution": r"\boxed{3} then \boxed{ 4 }"},
    ])
    records = jsonl.read_math_jsonl(path)
    self.assertEqual([r["answer"] for r in records], [r"\frac{1}{2}", "4"])
    self.assertEqual(records[0]["question"], "P1")

  @parameterized.named_parameters(
      ("no_box", {"problem": "P", "solution": "it is 4"},
       r":3: field 'solution' has no closed \\boxed"),
      ("unclosed_box", {"problem": "P", "solution": r"\boxed{\frac{1}{2}"},
       r":3: field 'solution' has no closed \\boxed"),
      ("missing_problem", {"solution": r"\boxed{1}"},
       r":3: missing field 'problem'"),
  )
  def test_malformed(self, bad_line, message):
    path = self.write("math.jsonl", [
        {"problem": "P", "solution": r"\boxed{1}"}, "   ", bad_line])
    with self.assertRaisesRegex(ValueError, "math.jsonl" + message):
      jsonl.read_math_jsonl(path)


if __name__ == "__main__":
  absltest.main()
