"""Label sets on disk: shards, resume points, manifest, malformed files."""

import json
import os
import re

import pytest

from rl_rewards.prm import label_store


def _record(position, q=(0.5, 1.0), **changes):
  record = {
      "split": "train", "index": position, "question": "23+07=",
      "prompt_ids": [1, 5, 6], "response_ids": [7, 8, 17, 9, 2],
      "text": "12\n3", "finished": True, "outcome": 1.0, "q": list(q),
      "hard": [1, 1], "rollouts": [4, 0], "v": 0.25, "v_rollouts": 4,
      "oracle": [True, True], "first_error": -1}
  record.update(changes)
  return record


def test_shards_round_trip(tmp_path):
  directory = str(tmp_path / "labels")
  records = [_record(0), _record(1, q=(float("nan"), 0.0), hard=[1, 0],
                                 v=None, oracle=None, first_error=None)]
  path = label_store.write_shard(directory, 0, records)
  assert os.path.basename(path) == "shard-00000.jsonl"
  back = label_store.read_shard(path)
  assert back[0] == records[0]
  # NaN is stored as null (strict JSON) and read back as None.
  assert back[1]["q"] == [None, 0.0] and back[1]["v"] is None
  with open(path) as f:
    assert "NaN" not in f.read()
  label_store.write_manifest(directory, {"num_shards": 1, "num_solutions": 2})
  manifest, all_records = label_store.read_label_set(directory)
  assert manifest["complete"] is True and manifest["num_solutions"] == 2
  assert all_records == back


def test_complete_shards_after_a_partial_write(tmp_path):
  directory = str(tmp_path / "labels")
  assert label_store.complete_shards(directory) == []
  for shard in (0, 1, 3):
    label_store.write_shard(directory, shard, [_record(shard)])
  # A shard interrupted mid-write leaves only its temporary file.
  with open(label_store.shard_path(directory, 2) + ".tmp123", "w") as f:
    f.write(json.dumps(_record(2))[:40])
  with open(os.path.join(directory, "notes.txt"), "w") as f:
    f.write("x")
  assert label_store.complete_shards(directory) == [0, 1, 3]
  # A resumed run rewrites shard 2; reading all shards then works, in order.
  label_store.write_shard(directory, 2, [_record(2)])
  assert label_store.complete_shards(directory) == [0, 1, 2, 3]
  records = label_store.read_shards(directory, 4)
  assert [r["index"] for r in records] == [0, 1, 2, 3]


def test_missing_manifest_and_missing_shard(tmp_path):
  directory = str(tmp_path / "labels")
  label_store.write_shard(directory, 0, [_record(0)])
  with pytest.raises(ValueError, match="no manifest.json"):
    label_store.read_label_set(directory)
  with pytest.raises(ValueError, match="no manifest.json"):
    label_store.read_manifest(str(tmp_path / "elsewhere"))
  label_store.write_manifest(directory, {"num_shards": 2})
  with pytest.raises(ValueError, match="shard 1 is missing"):
    label_store.read_label_set(directory)


def test_malformed_manifest(tmp_path):
  directory = tmp_path / "labels"
  directory.mkdir()
  (directory / "manifest.json").write_text("{not json")
  with pytest.raises(ValueError, match="manifest.json: invalid JSON"):
    label_store.read_manifest(str(directory))
  (directory / "manifest.json").write_text(json.dumps({"complete": True}))
  with pytest.raises(ValueError, match="num_shards"):
    label_store.read_manifest(str(directory))


def test_malformed_shard_line_names_file_and_line(tmp_path):
  directory = str(tmp_path / "labels")
  path = label_store.write_shard(directory, 0, [_record(i) for i in range(3)])
  with open(path) as f:
    lines = f.read().splitlines()
  lines[1] = lines[1][:-5]  # Truncated JSON on line 2.
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  with pytest.raises(ValueError,
                     match=f"{re.escape(path)}:2: invalid JSON"):
    label_store.read_shard(path)


@pytest.mark.parametrize("changes,message", [
    ({"q": [0.5, 1.5]}, "q values"),
    ({"hard": [1, 2]}, "hard labels"),
    ({"rollouts": [4]}, "'rollouts' has 1 entries"),
    ({"oracle": [True]}, "'oracle' has 1 entries"),
    ({"index": "3"}, "'index' has type str"),
    ({"finished": 1}, "'finished' has type int"),
    ({"outcome": True}, "'outcome' must not be a bool"),
    ({"response_ids": [1.5]}, "token ids"),
    ({"hard": [], "q": [], "rollouts": [], "oracle": None}, "one step"),
])
def test_invalid_record_names_file_line_and_field(tmp_path, changes,
                                                  message):
  directory = str(tmp_path / "labels")
  path = label_store.write_shard(directory, 0, [_record(0), _record(1)])
  with open(path) as f:
    lines = f.read().splitlines()
  lines.append(json.dumps(_record(2, **changes)))
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  with pytest.raises(ValueError, match=f"{re.escape(path)}:3: .*{message}"):
    label_store.read_shard(path)
  # The writer refuses the same record.
  with pytest.raises(ValueError, match=message):
    label_store.write_shard(directory, 1, [_record(2, **changes)])


def test_missing_field_and_non_object_line(tmp_path):
  path = str(tmp_path / "shard-00000.jsonl")
  record = _record(0)
  del record["v_rollouts"]
  with open(path, "w") as f:
    f.write("\n" + json.dumps(record) + "\n")
  with pytest.raises(ValueError,
                     match=f"{re.escape(path)}:2: missing field 'v_rollouts'"):
    label_store.read_shard(path)
  with open(path, "w") as f:
    f.write("[1, 2]\n")
  with pytest.raises(ValueError,
                     match=f"{re.escape(path)}:1: expected a JSON object"):
    label_store.read_shard(path)


def test_write_is_atomic_replace(tmp_path):
  directory = str(tmp_path / "labels")
  label_store.write_shard(directory, 0, [_record(0)])
  label_store.write_shard(directory, 0, [_record(5), _record(6)])
  assert [r["index"] for r in label_store.read_shard(
      label_store.shard_path(directory, 0))] == [5, 6]
  assert sorted(os.listdir(directory)) == ["shard-00000.jsonl"]


def test_a_kill_inside_a_shard_write_leaves_no_shard(tmp_path, monkeypatch):
  from rl_rewards import kill_points  # pylint: disable=g-import-not-at-top

  class Killed(BaseException):
    pass

  def killed():
    raise Killed()

  directory = str(tmp_path / "labels")
  label_store.write_shard(directory, 0, [_record(0)])
  monkeypatch.setenv(kill_points.KILL_ENV, "labels.shard:1")
  monkeypatch.setattr(kill_points, "kill_now", killed)
  kill_points.reset()
  with pytest.raises(Killed):
    label_store.write_shard(directory, 1, [_record(1)])
  monkeypatch.delenv(kill_points.KILL_ENV)
  kill_points.reset()
  # The shard's content is complete in a temporary file: only shard 0 is.
  assert label_store.complete_shards(directory) == [0]
  assert any(".tmp" in name for name in os.listdir(directory))
  label_store.remove_partial_files(directory)
  assert os.listdir(directory) == ["shard-00000.jsonl"]
