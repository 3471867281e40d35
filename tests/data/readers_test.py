"""Tests for rl_rewards.data.readers: formats, field maps, presets, errors."""

import json
import logging
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_rewards import errors
from rl_rewards.data import builders
from rl_rewards.data import readers

_ROWS = [{"problem": f"P{i}", "answer": str(i), "solution": f"s{i}"}
         for i in range(5)]


def _jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                          for r in rows))
  return str(path)


def _parquet(path, rows, row_group_size=2):
  pq.write_table(pa.Table.from_pylist(rows), str(path),
                 row_group_size=row_group_size)
  return str(path)


def _math500():
  return readers.PRESETS["math500"]


# ---------------------------------------------------------------- formats --


def _expected(rows):
  return [{"question": r["problem"], "answer": r["answer"],
           "solution": r["solution"], "index": i} for i, r in enumerate(rows)]


def test_jsonl_json_parquet_and_shards_give_the_same_records(tmp_path):
  jsonl = _jsonl(tmp_path / "d.jsonl", _ROWS)
  json_list = tmp_path / "d.json"
  json_list.write_text(json.dumps(_ROWS, indent=1))
  json_lines = _jsonl(tmp_path / "lines.json", _ROWS)
  parquet = _parquet(tmp_path / "d.parquet", _ROWS)
  shards = tmp_path / "shards"
  shards.mkdir()
  # Name order, not creation order: 00000 holds the first rows.
  _parquet(shards / "train-00001-of-00002.parquet", _ROWS[3:])
  _parquet(shards / "train-00000-of-00002.parquet", _ROWS[:3])
  (shards / "README.md").write_text("not data")
  for path in (jsonl, str(json_list), json_lines, parquet, str(shards)):
    assert readers.read_records(path, _math500()) == _expected(_ROWS), path


def test_parquet_is_read_one_row_group_at_a_time(tmp_path, monkeypatch):
  path = _parquet(tmp_path / "d.parquet", _ROWS, row_group_size=2)
  assert pq.ParquetFile(path).num_row_groups == 3
  monkeypatch.setattr(readers, "_PARQUET_BATCH_ROWS", 2)
  batches = []
  original = pq.ParquetFile.iter_batches

  def spy(self, *args, **kwargs):
    for batch in original(self, *args, **kwargs):
      batches.append(batch.num_rows)
      yield batch

  monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
  first = readers.check_first_record(path, _math500())
  assert first["question"] == "P0"
  assert batches == [2]  # The first row needs only the first batch.
  readers.read_records(path, _math500())
  assert batches[1:] == [2, 2, 1]


def test_nested_fields_and_list_indices(tmp_path):
  rows = [{"prompt": [{"role": "user", "content": f"Q{i}"}],
           "reward_model": {"ground_truth": str(i * 2), "style": "rule"},
           "extra_info": {"question": f"q{i}", "index": i}}
          for i in range(3)]
  for path in (_jsonl(tmp_path / "n.jsonl", rows),
               _parquet(tmp_path / "n.parquet", rows)):
    fields = readers.field_map(
        "math500", "question=extra_info.question,"
        "answer=reward_model.ground_truth,solution=")
    records = readers.read_records(path, fields)
    assert [(r["question"], r["answer"], r["solution"]) for r in records] == [
        ("q0", "0", ""), ("q1", "2", ""), ("q2", "4", "")]
    fields = readers.field_map("aime", "question=prompt.0.content,"
                               "answer=reward_model.ground_truth")
    assert readers.read_records(path, fields)[2]["question"] == "Q2"


# ---------------------------------------------------------------- presets --


def test_gsm8k_preset():
  record = readers.make_record(
      {"question": "Q", "answer": "3*4=<<3*4=12>>12 cans.\n#### 1,200"},
      readers.PRESETS["gsm8k"], "f:1")
  assert record == {"question": "Q", "answer": "1,200",
                    "solution": "3*4=<<3*4=12>>12 cans.\n#### 1,200"}


def test_math_preset_takes_the_last_box():
  record = readers.make_record(
      {"problem": "P", "solution": r"\boxed{1} so $\boxed{\frac{1}{2}}$.",
       "level": "Level 2"}, readers.PRESETS["math"], "f:1")
  assert record == {"question": "P", "answer": r"\frac{1}{2}",
                    "solution": r"\boxed{1} so $\boxed{\frac{1}{2}}$."}


@pytest.mark.parametrize("preset", ["math500", "deepscaler", "MATH500"])
def test_answer_field_presets(preset):
  # MATH-500 and DeepScaleR keep the answer in its own field; it wins over
  # the solution's box.
  row = {"problem": "P", "solution": r"\boxed{2}", "answer": " 3 ",
         "unique_id": "test/x.json"}
  record = readers.make_record(row, readers.field_map(preset), "f:1")
  assert record == {"question": "P", "answer": "3", "solution": r"\boxed{2}"}


@pytest.mark.parametrize("row", [
    # AI-MO/aimo-validation-aime.
    {"id": 60, "problem": "P", "solution": "long", "answer": "204",
     "url": "u"},
    # Maxwell-Jia/AIME_2024: capitalised keys and an integer answer.
    {"ID": "2024-I-1", "Problem": "P", "Solution": "long", "Answer": 204},
])
@pytest.mark.parametrize("name", ["aime", "aime24", "AIME25"])
def test_aime_layouts(row, name):
  fields = readers.field_map(name)
  assert not fields.has_solution
  record = readers.make_record(row, fields, "f:1")
  assert record == {"question": "P", "answer": "204", "solution": ""}


def test_case_insensitive_keys_must_be_unambiguous():
  with pytest.raises(errors.InputError,
                     match=r"f:1: missing field 'problem' \(the question; "
                     r"has \['PROBLEM', 'Problem', 'answer'\]\)"):
    readers.make_record({"Problem": "a", "PROBLEM": "b", "answer": "1"},
                        readers.PRESETS["aime"], "f:1")


def test_field_overrides_and_their_errors():
  fields = readers.field_map("gsm8k", "question=q, answer_from=field")
  assert fields == readers.FieldMap("q", "answer", "answer", "field")
  with pytest.raises(ValueError, match="unknown preset 'gsm9k'"):
    readers.field_map("gsm9k")
  with pytest.raises(ValueError, match=r"bad entry 'problem=x'"):
    readers.field_map("math", "problem=x")
  with pytest.raises(ValueError, match=r"answer_from=boxed needs the path of "
                     "the solution"):
    readers.field_map("math", "solution=")
  with pytest.raises(ValueError, match=r"answer_from: must be one of"):
    readers.field_map("math", "answer_from=last")


# ---------------------------------------------------------------- errors --


@pytest.mark.parametrize("bad, message", [
    ({"problem": "P"}, r":3: missing field 'answer' \(has \['problem'\]\)"),
    ({"problem": 7, "answer": "1"},
     r":3: field 'problem' \(the question\) must be a string, got int"),
    ({"problem": "P", "answer": 1.5},
     r":3: field 'answer' must be a string or an integer, got float"),
    ({"problem": "P", "answer": True},
     r":3: field 'answer' must be a string or an integer, got bool"),
    ({"problem": "P", "answer": "  "}, r":3: field 'answer' \(the answer\) "
     r"is empty"),
    ('{"problem": "P", ', r":3: invalid JSON"),
    ("[1, 2]", r":3: expected a JSON object, got list"),
])
def test_malformed_jsonl_row_names_file_and_line(tmp_path, bad, message):
  path = _jsonl(tmp_path / "bad.jsonl", [_ROWS[0], "", bad])
  with pytest.raises(errors.InputError, match=re.escape(path) + message):
    readers.read_records(path, readers.PRESETS["aime"])


def test_malformed_parquet_row_names_file_and_row(tmp_path):
  rows = [{"problem": "P", "answer": "1", "extra": {"q": "x"}},
          {"problem": "P", "answer": "2", "extra": {"q": None}},
          {"problem": None, "answer": "3", "extra": {"q": "z"}}]
  path = _parquet(tmp_path / "bad.parquet", rows)
  with pytest.raises(errors.InputError, match=re.escape(path) + r": row 2: "
                     r"field 'problem' \(the question\) must be a string, got "
                     "null"):
    readers.read_records(path, readers.PRESETS["aime"])
  nested = readers.field_map("aime", "question=extra.q")
  with pytest.raises(errors.InputError, match=re.escape(path) + r": row 1: "
                     r"field 'extra.q' \(the question\) must be a string"):
    readers.read_records(path, nested)
  shards = tmp_path / "shards"
  shards.mkdir()
  _parquet(shards / "a.parquet", _ROWS[:3])
  _parquet(shards / "b.parquet", [{"problem": "P", "solution": "s"}])
  with pytest.raises(errors.InputError, match=re.escape(
      str(shards / "b.parquet")) + r": row 0: missing field 'answer'"):
    readers.read_records(str(shards), _math500())


def test_malformed_json_files(tmp_path):
  items = tmp_path / "items.json"
  items.write_text(json.dumps([_ROWS[0], {"problem": "P"}]))
  with pytest.raises(errors.InputError, match=re.escape(str(items)) +
                     r": item 1: missing field 'solution'"):
    readers.read_records(str(items), _math500())
  wrapped = tmp_path / "wrapped.json"
  wrapped.write_text(json.dumps({"data": _ROWS}, indent=1))
  with pytest.raises(errors.InputError, match=re.escape(str(wrapped)) +
                     r": the top level is a JSON object \(keys \['data'\]\)"):
    readers.read_records(str(wrapped), _math500())
  broken = tmp_path / "broken.json"
  broken.write_text('[\n{"problem": "P",\n')
  with pytest.raises(errors.InputError,
                     match=re.escape(str(broken)) + r":3: invalid JSON"):
    readers.read_records(str(broken), _math500())


def test_empty_missing_and_unknown_files(tmp_path):
  for name, text in (("e.jsonl", "\n\n"), ("e.json", "[]")):
    (tmp_path / name).write_text(text)
    with pytest.raises(errors.InputError, match=name + ": no records"):
      readers.read_records(str(tmp_path / name), _math500())
    with pytest.raises(errors.InputError, match=name + ": no records"):
      readers.check_first_record(str(tmp_path / name), _math500())
  empty = _parquet(tmp_path / "e.parquet", [])
  with pytest.raises(errors.InputError, match="e.parquet: no records"):
    readers.read_records(empty, _math500())
  with pytest.raises(errors.InputError, match="nope.parquet: file not found"):
    readers.read_records(str(tmp_path / "nope.parquet"), _math500())
  (tmp_path / "d.csv").write_text("problem,answer\n")
  with pytest.raises(errors.InputError, match=r"d.csv: unknown data format "
                     r"'.csv'"):
    readers.read_records(str(tmp_path / "d.csv"), _math500())
  (tmp_path / "fake.parquet").write_text("not parquet")
  with pytest.raises(errors.InputError,
                     match="fake.parquet: not a readable Parquet file"):
    readers.read_records(str(tmp_path / "fake.parquet"), _math500())
  (tmp_path / "nothing").mkdir()
  with pytest.raises(errors.InputError,
                     match=r"nothing: a directory without \*.parquet files"):
    readers.read_records(str(tmp_path / "nothing"), _math500())


# --------------------------------------------------------------- builders --


def test_parquet_shards_builder_and_fingerprint(tmp_path):
  shards = tmp_path / "shards"
  shards.mkdir()
  _parquet(shards / "0.parquet", _ROWS[:2])
  _parquet(shards / "1.parquet", _ROWS[2:])
  data_dir = str(tmp_path / "tfds")
  builder = builders.text_files({"train": str(shards)}, data_dir, _math500())
  source = builders.data_source(builder, "train")
  assert len(source) == 5
  assert source[4]["question"] == b"P4" and source[4]["solution"] == b"s4"
  # Another field map of the same files is another dataset.
  other = builders.text_files({"train": str(shards)}, data_dir,
                              readers.PRESETS["aime"])
  assert other.builder_config.name != builder.builder_config.name
  assert builders.data_source(other, "train")[4]["solution"] == b""
  # So is a changed shard.
  _parquet(shards / "1.parquet", _ROWS[2:4])
  again = builders.text_files({"train": str(shards)}, data_dir, _math500())
  assert again.builder_config.name != builder.builder_config.name
  assert len(builders.data_source(again, "train")) == 4


def test_preparing_local_files_does_not_say_downloaded(tmp_path, capsys,
                                                       caplog):
  path = _jsonl(tmp_path / "d.jsonl", _ROWS)
  caplog.set_level(logging.INFO)
  builders.text_files({"train": path}, str(tmp_path / "tfds"), _math500())
  assert "download" not in capsys.readouterr().out.lower()
  lines = [r.getMessage() for r in caplog.records]
  prepared = [line for line in lines if line.startswith("Prepared ")]
  assert len(prepared) == 1, lines
  assert f"from local files train: {path} into {tmp_path / 'tfds'}" in (
      prepared[0])
  assert "(nothing downloaded)" in prepared[0]
  assert not any("downloaded and prepared" in line for line in lines)
