"""ProcessBench files: hand-computed metrics, the threshold rule, the step
labels a first-error index implies, malformed rows, and encoding through
the task's delimiter (docs/algorithms.md, "PRM evaluation")."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards.prm import processbench
from rl_rewards.runners import tasks as tasks_lib


class TestMetrics:

  def test_hand_computed_accuracies_f1_and_auroc(self):
    # Three erroneous solutions (labels 1, 0, 2) and two correct ones.
    scores = np.array([[0.9, 0.2, 0.1],    # predicted 1: right
                       [0.8, 0.7, 0.3],    # predicted 2, label 0: wrong
                       [0.6, 0.9, 0.95],   # predicted −1, label 2: wrong
                       [0.7, 0.8, 0.0],    # 2 valid steps: predicted −1
                       [0.9, 0.6, 0.55]])  # predicted −1: right
    mask = np.ones(scores.shape, bool)
    mask[3, 2] = False
    labels = [1, 0, 2, -1, -1]
    out = processbench.file_metrics(scores, mask, labels, 0.5)
    # acc_err = 1/3, acc_cor = 2/2: F1 = 2·(1/3)·1 / (4/3) = 1/2.
    assert out["acc_err"] == pytest.approx(1 / 3)
    assert out["acc_cor"] == 1.0
    assert out["f1"] == pytest.approx(0.5)
    assert (out["num_err"], out["num_cor"]) == (3, 2)
    # Steps covered: row 0: 0.9 (+), 0.2 (−); row 1: 0.8 (−); row 2: 0.6,
    # 0.9 (+), 0.95 (−); row 3: 0.7, 0.8 (+); row 4: 0.9, 0.6, 0.55 (+).
    # Positives 0.9 0.6 0.9 0.7 0.8 0.9 0.6 0.55 against negatives 0.2, 0.8,
    # 0.95: above 0.2: 8; above 0.8: 3, plus ½ for the tie at 0.8; above
    # 0.95: 0. AUROC = (8 + 3.5 + 0) / 24.
    assert out["auroc"] == pytest.approx(11.5 / 24)
    assert out["threshold"] == 0.5

  def test_off_by_one_and_swapped_accuracies_fail(self):
    # Every erroneous solution's first low step is exactly its label; the
    # correct ones are all high, so both accuracies are 1. A prediction one
    # step late or early, or correct/erroneous swapped, changes them.
    scores = np.array([[0.2, 0.1], [0.9, 0.3], [0.9, 0.8]])
    mask = np.ones(scores.shape, bool)
    assert processbench.file_metrics(scores, mask, [0, 1, -1])["f1"] == 1.0
    shifted = processbench.file_metrics(scores, mask, [1, 0, -1])
    assert shifted["acc_err"] == 0.0 and shifted["acc_cor"] == 1.0
    # The correct solution labelled 0: it is missed (acc_err 2/3), and no
    # correct solution is left (acc_cor undefined).
    out = processbench.file_metrics(scores, mask, [0, 1, 0])
    assert out["acc_err"] == pytest.approx(2 / 3)
    assert np.isnan(out["acc_cor"])

  def test_score_equal_to_threshold_is_wrong(self):
    # ProcessBench's code takes the argmax of the two classes; a tie goes to
    # the first (wrong) class, so P(right) = τ = ½ is a predicted error.
    scores = np.array([[0.9, 0.5, 0.2], [0.51, 0.6, 0.7]])
    mask = np.ones(scores.shape, bool)
    out = processbench.file_metrics(scores, mask, [1, -1], 0.5)
    assert out["acc_err"] == 1.0 and out["acc_cor"] == 1.0

  def test_first_error_step_labels(self):
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], bool)
    labels, known = processbench.first_error_step_labels([2, -1, 0], mask)
    np.testing.assert_array_equal(known, [[1, 1, 1, 0], [1, 1, 1, 0],
                                          [1, 0, 0, 0]])
    np.testing.assert_array_equal(labels[known], [1, 1, 0, 1, 1, 1, 0])

  def test_later_steps_do_not_count_in_auroc(self):
    # After the first error, a high score (0.99) is unlabelled: AUROC 1.
    scores = np.array([[0.9, 0.1, 0.99], [0.8, 0.7, 0.6]])
    mask = np.ones(scores.shape, bool)
    assert processbench.file_metrics(scores, mask, [1, -1])["auroc"] == 1.0

  def test_table(self):
    scores = np.array([[0.9, 0.1], [0.9, 0.9]])
    mask = np.ones(scores.shape, bool)
    m = processbench.file_metrics(scores, mask, [1, -1])
    table = processbench.format_table({"gsm8k": m, "math": m})
    assert "| gsm8k | 2 | 1 | 1 | 100.0 | 100.0 | 100.0 |" in table
    assert "| mean F1 | | | | | | 100.0 |" in table


def _good():
  return {"id": "a-1", "generator": "m", "problem": "1+1?",
          "steps": ["1+1=2", "#2"], "label": -1,
          "final_answer_correct": True}


def _jsonl(tmp_path, rows, name="gsm8k.jsonl"):
  path = tmp_path / name
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


class TestReading:

  def test_reads_rows_and_subset_names(self, tmp_path):
    second = dict(_good(), id=7, label=1)
    del second["generator"], second["final_answer_correct"]
    path = _jsonl(tmp_path, [_good(), second])
    rows = processbench.read_file(path)
    assert [r.id for r in rows] == ["a-1", "7"]
    assert rows[1].label == 1 and rows[1].steps == ("1+1=2", "#2")
    assert rows[1].final_answer_correct is None
    assert processbench.subset_name(path) == "gsm8k"
    assert processbench.subset_name("/x/olympiadbench.parquet") == (
        "olympiadbench")

  @pytest.mark.parametrize("change, message", [
      ({"label": 2}, r"'label' = 2 is not −1 or a step index in \[0, 1\]"),
      ({"label": -2}, "'label' = -2"),
      ({"label": True}, "'label' must be an integer"),
      ({"label": "1"}, "'label' must be an integer"),
      ({"steps": "1+1=2"}, "'steps' must be a non-empty list of strings"),
      ({"steps": []}, "'steps' must be a non-empty list"),
      ({"steps": ["a", 3]}, "'steps' must be a non-empty list"),
      ({"problem": None}, "'problem' must be a string"),
      ({"final_answer_correct": "yes"}, "'final_answer_correct' must be"),
  ])
  def test_malformed_row_names_file_and_line(self, tmp_path, change,
                                             message):
    path = _jsonl(tmp_path, [_good(), dict(_good(), **change)])
    with pytest.raises(errors.InputError, match=message) as e:
      processbench.read_file(path)
    assert str(e.value).startswith(f"{path}:2: ")

  def test_missing_field_and_not_an_object(self, tmp_path):
    row = _good()
    del row["steps"]
    path = _jsonl(tmp_path, [row])
    with pytest.raises(errors.InputError, match=f"{path}:1: missing field "
                       "'steps'"):
      processbench.read_file(path)
    path = _jsonl(tmp_path, [_good(), [1, 2]], "list.jsonl")
    with pytest.raises(errors.InputError, match=f"{path}:2: expected a JSON "
                       "object"):
      processbench.read_file(path)

  def test_parquet_and_json_rows_are_named(self, tmp_path):
    path = str(tmp_path / "math.parquet")
    pq.write_table(pa.Table.from_pylist(
        [_good(), dict(_good(), label=5)]), path)
    with pytest.raises(errors.InputError, match=f"{path}: row 1: field "
                       "'label' = 5"):
      processbench.read_file(path)
    path = tmp_path / "omnimath.json"
    path.write_text(json.dumps([_good(), dict(_good(), steps=None)]))
    with pytest.raises(errors.InputError, match="omnimath.json: item 1: "
                       "field 'steps'"):
      processbench.read_file(str(path))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(errors.InputError, match="no rows"):
      processbench.read_file(str(empty))


def _arith_task():
  config = config_lib.base_config()
  return tasks_lib.ArithTask(config.task, seed=0)


class TestEncoding:

  def test_steps_join_with_the_delimiter_and_end_of_turn(self, tmp_path):
    task = _arith_task()
    path = _jsonl(tmp_path, [dict(_good(), problem="01+02=",
                                  steps=["001+02=003", "#003"], label=0)])
    rows = processbench.read_file(path)
    prompts, responses = processbench.encode_rows(task, rows,
                                                  max_prompt_len=32)
    tokenizer = task.tokenizer
    assert tokenizer.decode(responses[0][:-1]) == "001+02=003\n#003"
    assert responses[0][-1] == tokenizer.end_of_turn_id
    assert tokenizer.decode(prompts[0]) == "01+02="

  def test_a_step_holding_the_delimiter(self, tmp_path):
    task = _arith_task()
    path = _jsonl(tmp_path, [dict(_good(), problem="1+2=",
                                  steps=["1+2=3\n3", "#3"])])
    rows = processbench.read_file(path)
    with pytest.raises(errors.InputError, match=f"{path}:1: step 0 contains "
                       "the step delimiter"):
      processbench.encode_rows(task, rows, max_prompt_len=32)
    with pytest.raises(errors.InputError, match=f"{path}:1: "):
      # " " is outside the arithmetic alphabet: the row is named.
      processbench.encode_rows(task, rows, max_prompt_len=32,
                               inner_delimiter="space")

  def test_prompt_too_long_names_the_row(self, tmp_path):
    task = _arith_task()
    path = _jsonl(tmp_path, [dict(_good(), problem="1+2=" * 20,
                                  steps=["1+2=3"], label=-1)])
    rows = processbench.read_file(path)
    with pytest.raises(errors.InputError, match=f"{path}:1: prompt 0 has"):
      processbench.encode_rows(task, rows, max_prompt_len=16)
