"""Stepwise PRM files: the layouts, their errors, the label records made of
them, and the `prm.data=file` config checks."""

import json
import os

import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards.data import stepwise
from rl_rewards.prm import label_store
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_files
from rl_rewards.tasks import tokenizer as tokenizer_lib
from tests.runners import gsm8k_files

from . import stepwise_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TRL = stepwise.field_map()
SHEPHERD = stepwise.field_map("math_shepherd")

TRL_ROWS = [
    {"prompt": "What is 2+3+4?", "completions": ["2+3=5", "5+4=9"],
     "labels": [True, False]},
    # Soft labels; 1/2 is a positive hard label; 1 is an integer.
    {"prompt": "What is 1+1+1?", "completions": ["1+1=2", "2+1=3", "3"],
     "labels": [0.75, 0.5, 1]},
    {"prompt": "What is 4-1?", "completions": ["4-1=3"], "labels": [0]},
]
TRL_EXPECTED = [
    {"prompt": "What is 2+3+4?", "steps": ["2+3=5", "5+4=9"],
     "q": [1.0, 0.0], "hard": [1, 0], "outcome": 0.0},
    {"prompt": "What is 1+1+1?", "steps": ["1+1=2", "2+1=3", "3"],
     "q": [0.75, 0.5, 1.0], "hard": [1, 1, 1], "outcome": 1.0},
    {"prompt": "What is 4-1?", "steps": ["4-1=3"], "q": [0.0], "hard": [0],
     "outcome": 0.0},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_trl_rows_in_every_format_give_the_hand_written_records(
    suffix, tmp_path):
  path = stepwise_files.write(tmp_path / f"data{suffix}", TRL_ROWS)
  examples = stepwise.read_examples(path, TRL)
  assert [e for _, e in examples] == TRL_EXPECTED
  where = {".jsonl": f"{path}:3", ".json": f"{path}: item 2",
           ".parquet": f"{path}: row 2"}[suffix]
  assert examples[2][0] == where


def test_renamed_fields_soft_labels_and_outcome(tmp_path):
  row = {"meta": {"question": "What is 2+2?"}, "steps": ["2+2=4", "4"],
         "hard": [True, False], "mc": [0.875, 0.25], "solved": 1}
  path = stepwise_files.write(tmp_path / "renamed.jsonl", [row])
  fields = stepwise.field_map(
      "trl", "prompt=meta.question,completions=steps,labels=hard,"
      "soft_labels=mc,outcome=solved")
  (_, example), = stepwise.read_examples(path, fields)
  assert example == {"prompt": "What is 2+2?", "steps": ["2+2=4", "4"],
                     "q": [0.875, 0.25], "hard": [1, 0], "outcome": 1.0}


SHEPHERD_ROWS = [
    # The layout of Math-Shepherd: question, then "Step k: ... ки" lines.
    ({"input": "Janet has 3 apples. She buys 2 more. How many now? Step 1: "
               "She has 3 + 2 = 5 apples. ки\nStep 2: The answer is: 6 ки",
      "label": "Janet has 3 apples. She buys 2 more. How many now? Step 1: "
               "She has 3 + 2 = 5 apples. +\nStep 2: The answer is: 6 -",
      "task": "GSM8K"},
     {"prompt": "Janet has 3 apples. She buys 2 more. How many now?",
      "steps": ["Step 1: She has 3 + 2 = 5 apples.",
                "Step 2: The answer is: 6"],
      "q": [1.0, 0.0], "hard": [1, 0], "outcome": 0.0}),
    # A tag inside the question (an annotation slip) is dropped with its
    # label; "step 1:" in lower case starts the solution.
    ({"input": "Mr. Rocky sells 4 jugs. ки He sells 2 more. How many? "
               "step 1: 4 + 2 = 6 ки\nStep 2: The answer is: 6 ки",
      "label": "Mr. Rocky sells 4 jugs. - He sells 2 more. How many? "
               "step 1: 4 + 2 = 6 +\nStep 2: The answer is: 6 +"},
     {"prompt": "Mr. Rocky sells 4 jugs.  He sells 2 more. How many?",
      "steps": ["step 1: 4 + 2 = 6", "Step 2: The answer is: 6"],
      "q": [1.0, 1.0], "hard": [1, 1], "outcome": 1.0}),
    # No "Step 1:": the question ends at its last "?".
    ({"input": "What is 1 + 1? 1 + 1 = 2 ки\nThe answer is: 2 ки",
      "label": "What is 1 + 1? 1 + 1 = 2 +\nThe answer is: 2 +"},
     {"prompt": "What is 1 + 1?", "steps": ["1 + 1 = 2", "The answer is: 2"],
      "q": [1.0, 1.0], "hard": [1, 1], "outcome": 1.0}),
]


def test_math_shepherd_rows_give_the_hand_written_records(tmp_path):
  path = stepwise_files.write(tmp_path / "shepherd.jsonl",
                              [row for row, _ in SHEPHERD_ROWS])
  examples = stepwise.read_examples(path, SHEPHERD)
  assert [e for _, e in examples] == [e for _, e in SHEPHERD_ROWS]


def test_math_shepherd_row_equals_its_trl_conversion(tmp_path):
  rows = stepwise_files.trl_rows(4)
  shepherd = stepwise_files.write(
      tmp_path / "s.parquet", [stepwise_files.math_shepherd_row(r)
                               for r in rows])
  trl = stepwise_files.write(tmp_path / "t.jsonl", rows)
  got = [e for _, e in stepwise.read_examples(shepherd, SHEPHERD)]
  want = [e for _, e in stepwise.read_examples(trl, TRL)]
  for g, w in zip(got, want):
    assert g["steps"] == [f"Step {k + 1}: {s}" for k, s in
                          enumerate(w["steps"])]
    assert (g["prompt"], g["hard"], g["q"]) == (w["prompt"], w["hard"],
                                                w["q"])


_GOOD = TRL_ROWS[0]
_BAD_TRL = [
    ({"prompt": "q", "completions": ["a"]}, r"missing field 'labels'"),
    ({"prompt": "q", "completions": ["a", "b"], "labels": [True]},
     r"'labels' has 1 labels for 2 steps"),
    ({"prompt": "q", "completions": ["a"], "labels": ["yes"]},
     r"labels\[0\] must be a bool, 0 / 1 or a number in \[0, 1\], got str"),
    ({"prompt": "q", "completions": ["a", "b"], "labels": [True, 1.5]},
     r"labels\[1\] must be a bool"),
    ({"prompt": "q", "completions": ["a", "b"], "labels": [True, 2]},
     r"labels\[1\] must be a bool"),
    ({"prompt": "q", "completions": ["a", " "], "labels": [True, True]},
     r"completions\[1\] is an empty step"),
    ({"prompt": "q", "completions": [], "labels": []},
     r"'completions' must be a non-empty list of step strings, got an empty"),
    ({"prompt": "q", "completions": "a", "labels": [True]},
     r"'completions' must be a non-empty list of step strings, got str"),
    ({"prompt": "q", "completions": ["a", 3], "labels": [True, True]},
     r"completions\[1\] must be a string, got int"),
    ({"prompt": 7, "completions": ["a"], "labels": [True]},
     r"'prompt' must be a non-empty string"),
    ({"prompt": "q", "completions": ["a\nb"], "labels": [True]},
     r"completions\[0\] contains the step delimiter '\\n'"),
    ({"prompt": "q", "completions": ["a"], "labels": True},
     r"'labels' must be a list, got bool"),
]


@pytest.mark.parametrize("row,message", _BAD_TRL)
def test_malformed_jsonl_row_names_file_line_and_field(row, message,
                                                       tmp_path):
  path = stepwise_files.write(tmp_path / "bad.jsonl", [_GOOD, row])
  with pytest.raises(errors.InputError, match=f"bad.jsonl:2: .*{message}"):
    stepwise.read_examples(path, TRL)


def test_malformed_rows_in_json_and_parquet_name_item_and_row(tmp_path):
  bad = {"prompt": "q", "completions": ["a", "b"], "labels": [True]}
  json_path = stepwise_files.write(tmp_path / "bad.json", [_GOOD, bad])
  with pytest.raises(errors.InputError, match=r"bad.json: item 1: .*1 labels"):
    stepwise.read_examples(json_path, TRL)
  parquet = stepwise_files.write(tmp_path / "bad.parquet",
                                 [_GOOD, _GOOD, bad])
  with pytest.raises(errors.InputError, match=r"bad.parquet: row 2: .*1 lab"):
    stepwise.read_examples(parquet, TRL)
  with pytest.raises(errors.InputError, match="bad.jsonl: file not found"):
    stepwise.read_examples(str(tmp_path / "bad.jsonl"), TRL)
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(errors.InputError, match="empty.jsonl: no rows"):
    stepwise.read_examples(str(tmp_path / "empty.jsonl"), TRL)
  (tmp_path / "list.jsonl").write_text("[1, 2]\n")
  with pytest.raises(errors.InputError,
                     match="list.jsonl:1: expected an object, got list"):
    stepwise.read_examples(str(tmp_path / "list.jsonl"), TRL)


_BAD_SHEPHERD = [
    ({"input": "q? a", "label": "q? a"}, r"has no step tag 'ки'"),
    ({"input": "q? Step 1: a ки", "label": "q? Step 1: b +"},
     r"'label' differs from 'input' outside the step tags \(before tag 0\)"),
    ({"input": "q? Step 1: a ки", "label": "q? Step 1: a x"},
     r"'label' has 'x' where 'input' has tag 0"),
    ({"input": "q? Step 1: a ки", "label": "q? Step 1: a +!"},
     r"'label' is longer than 'input'"),
    ({"input": "q? Step 1: a ки b", "label": "q? Step 1: a + b"},
     r"text after its last step tag"),
    ({"input": "no question a ки", "label": "no question a +"},
     r"no 'Step 1:' and no '\?' ends the question"),
    ({"input": "q? Step 1: a ки ки", "label": "q? Step 1: a + +"},
     r"input steps\[1\] is an empty step"),
    ({"input": "q? Step 1: a ки", "label": 3}, r"'label' must be a string"),
]


@pytest.mark.parametrize("row,message", _BAD_SHEPHERD)
def test_malformed_math_shepherd_row_names_file_and_row(row, message,
                                                        tmp_path):
  good = SHEPHERD_ROWS[0][0]
  path = stepwise_files.write(tmp_path / "bad.jsonl", [good, row])
  with pytest.raises(errors.InputError, match=f"bad.jsonl:2: .*{message}"):
    stepwise.read_examples(path, SHEPHERD)


def test_field_map_errors_name_the_part_at_fault():
  with pytest.raises(ValueError, match="unknown preset 'prm800k'"):
    stepwise.field_map("prm800k")
  with pytest.raises(ValueError, match="bad entry 'input=x'"):
    stepwise.field_map("trl", "input=x")
  with pytest.raises(ValueError, match="labels: the trl layout needs"):
    stepwise.field_map("", "labels=")
  assert stepwise.field_map("Math_Shepherd", "input=q.text").input == "q.text"


# ------------------------------------------------------- label records --


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  root = tmp_path_factory.mktemp("tok")
  stepwise_files.tokenizer().save(str(root / "tokenizer.json"))
  (root / "tokenizer_config.json").write_text(json.dumps({
      "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
  return tokenizer_lib.HFTokenizer(str(root / "tokenizer.json"),
                                   prompt_template="Q: {question}")


def _records(tok, examples, **kwargs):
  args = dict(tokenizer=tok, delimiter="\n",
              delimiter_mask=tok.delimiter_mask("\n"), max_prompt_len=24,
              max_new_tokens=24, split="train")
  args.update(kwargs)
  return prm_files.records_from_examples(examples, **args)


def test_label_records_hold_the_tokens_and_labels(tokenizer):
  example = {"prompt": "How many now?", "steps": ["2 + 3 = 5", "so 6"],
             "q": [0.75, 0.25], "hard": [1, 0], "outcome": 0.0}
  record, = _records(tokenizer, [("f.jsonl:1", example)])
  vocab = json.load(open(tokenizer.path, encoding="utf-8"))["model"]["vocab"]
  ids = vocab.__getitem__
  assert record["prompt_ids"] == [ids(w) for w in
                                  ("Q:", "How", "many", "now?")]
  # The steps joined by the delimiter, then the end-of-turn token.
  assert record["response_ids"] == [ids(w) for w in (
      "2", "+", "3", "=", "5", "\n", "so", "6", "<|im_end|>")]
  assert record["text"] == "2 + 3 = 5\nso 6"
  assert (record["q"], record["hard"], record["rollouts"]) == (
      [0.75, 0.25], [1, 0], [0, 0])
  assert (record["v"], record["oracle"], record["first_error"],
          record["outcome"], record["finished"]) == (None, None, None, 0.0,
                                                     True)
  label_store.validate_record(record, "record")


def test_label_records_fail_on_rows_that_do_not_fit(tokenizer, tmp_path):
  good = {"prompt": "How many?", "steps": ["1", "2"], "q": [1.0, 1.0],
          "hard": [1, 1], "outcome": 1.0}
  long = dict(good, prompt=" ".join(["apples"] * 30))
  with pytest.raises(errors.InputError,
                     match=r"f.jsonl:2: prompt 0 has 31 tokens .*"
                           r"max_prompt_len=24.*Raise config.task"):
    _records(tokenizer, [("f.jsonl:1", good), ("f.jsonl:2", long)])
  with pytest.raises(errors.InputError,
                     match=r"f.jsonl:1: the solution has 4 tokens .* "
                           r"config.task.max_new_tokens=3"):
    _records(tokenizer, [("f.jsonl:1", good)], max_new_tokens=3)
  # A tokenizer that drops the newline cannot cut the steps apart.
  root = tmp_path / "drops"
  root.mkdir()
  gsm8k_files.word_level_tokenizer(
      stepwise_files.SPECIAL_TOKENS, "1 2 How many?").save(
          str(root / "tokenizer.json"))
  drops = tokenizer_lib.HFTokenizer(str(root / "tokenizer.json"))
  with pytest.raises(errors.InputError,
                     match=r"f.jsonl:1: 2 steps, but the tokenizer cuts the "
                           r"joined solution into 1"):
    _records(drops, [("f.jsonl:1", good)],
             delimiter_mask=drops.delimiter_mask("\n"))


# -------------------------------------------------------------- config --


def _config(**prm):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py") + ":data=file,size=test")
  config.model.hf_path = "/nonexistent"
  config.task.train_path = config.task.eval_path = "/nonexistent.jsonl"
  config.prm.train_path = "/nonexistent/train.jsonl"
  config.prm.update(prm)
  return config


@pytest.mark.parametrize("change,message", [
    (dict(train_path=""), r"config.prm.train_path: prm.data='file' needs"),
    (dict(preset="prm800k"), r"config.prm.preset: unknown preset 'prm800k'"),
    (dict(fields="answer=x"), r"config.prm.fields: bad entry 'answer=x'"),
    (dict(target="progress"), r"config.prm.target: must be soft or hard"),
    (dict(model="implicit", implicit_loss="dpo"),
     r"config.prm.implicit_loss: the DPO loss pairs"),
    (dict(data="files"), r"config.prm.data: must be one of"),
])
def test_bad_file_config_names_the_key(change, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(_config(**change))


def test_file_keys_and_stages_are_checked():
  config = _config()
  config.stages = "labels,prm"
  with pytest.raises(config_lib.ConfigError,
                     match="config.stages: prm.data='file' trains on"):
    config_lib.validate(config)
  config = _config(data="labels")
  with pytest.raises(config_lib.ConfigError,
                     match="config.prm.train_path: is only read with"):
    config_lib.validate(config)
  # A file PRM's batch need not hold groups of labels.samples_per_problem.
  config = _config(batch_size=3)
  config.labels.samples_per_problem = 2
  config_lib.validate(config)


def test_files_are_checked_before_any_stage(tmp_path):
  config = _config(train_path=str(tmp_path / "missing.jsonl"))
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.prm.train_path: .*missing.jsonl: file "
                           r"not found"):
    pipeline.check_stages(config, str(tmp_path / "run"))
  bad = stepwise_files.write(tmp_path / "bad.parquet", [
      {"prompt": "q", "completions": ["a", ""], "labels": [True, True]}])
  good = stepwise_files.write(tmp_path / "good.jsonl", TRL_ROWS)
  config = _config(train_path=good, valid_path=bad)
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.prm.valid_path: .*bad.parquet: row 0: "
                           r"completions\[1\] is an empty step"):
    pipeline.check_stages(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_label_records_name_the_row_of_text_the_tokenizer_cannot_encode():
  chars = tokenizer_lib.CharTokenizer()
  good = {"prompt": "1+2=", "steps": ["1+2=3", "3"], "q": [1.0, 1.0],
          "hard": [1, 1], "outcome": 1.0}
  record, = _records(chars, [("f.jsonl:1", good)],
                     delimiter_mask=chars.delimiter_mask("\n"))
  # BOS + the prompt's characters; the steps joined by "\n", then EOS.
  assert record["prompt_ids"] == [chars.bos_id] + chars.encode("1+2=")
  assert record["response_ids"] == chars.encode("1+2=3\n3") + [chars.eos_id]
  with pytest.raises(errors.InputError,
                     match=r"f.jsonl:2: character 'x' at position 2"):
    _records(chars, [("f.jsonl:1", good),
                     ("f.jsonl:2", dict(good, steps=["1+x", "3"]))],
             delimiter_mask=chars.delimiter_mask("\n"))
