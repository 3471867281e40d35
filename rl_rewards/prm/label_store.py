"""Label sets on disk: JSONL shards plus a manifest, written resumably.

A label set is a directory:

  shard-00000.jsonl, shard-00001.jsonl, ...   one labelled solution a line
  manifest.json                               written last, when complete

Each shard is written to a temporary file and renamed, so a shard file
exists only once it is complete: a labelling run killed at any moment
resumes from the shards already on disk. Only JSON is ever read (no
pickle); a malformed line fails with the file and line number.

A record (one solution) holds:

  split, index, question    the problem (index in the split's stream)
  prompt_ids, response_ids  the tokens (EOS included when finished)
  text, finished, outcome   the decoded response and its verdict
  q        [K] Q̂ of the prefix through each step (null: not estimated)
  hard     [K] hard label of each step (1 = some continuation correct)
  rollouts [K] continuations behind each label (0: the outcome itself)
  v, v_rollouts             V̂ of the question (null: not estimated)
  oracle   [K] ground-truth step labels, or null when the task has none
  first_error               the oracle's first wrong step (−1: none), or null

and, for a multi-turn episode (optional, absent for single-turn solutions):

  turn_ids [len(response_ids)] the turn of each response token, −1 on the
           environment's observations; the K turns are the steps (the
           verifier scores each at its turn's last token, never an
           observation)
"""

import json
import math
import os
import re

from rl_rewards import errors
from rl_rewards import kill_points
from rl_rewards.data import jsonl

MANIFEST = "manifest.json"
_SHARD_RE = re.compile(r"^shard-(\d{5})\.jsonl$")

_FIELDS = {
    "split": str, "index": int, "question": str, "prompt_ids": list,
    "response_ids": list, "text": str, "finished": bool,
    "outcome": (int, float), "q": list, "hard": list, "rollouts": list,
    "v": (int, float, type(None)), "v_rollouts": int,
    "oracle": (list, type(None)), "first_error": (int, type(None)),
}


def shard_path(directory: str, shard: int) -> str:
  return os.path.join(directory, f"shard-{shard:05d}.jsonl")


def _json_value(value):
  if isinstance(value, float) and math.isnan(value):
    return None
  if isinstance(value, list):
    return [_json_value(v) for v in value]
  return value


def _atomic_write(path: str, text: str, kill_point: str = ""):
  """Writes `path` whole or not at all; a full disk removes the partial
  temporary file and raises an ENOSPC `OSError` naming `path`."""
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if errors.is_disk_full(e):
      raise errors.disk_full(path, "the shards already written are intact "
                             "and a rerun resumes after them") from e
    raise
  if kill_point:
    kill_points.point(kill_point)
  os.replace(tmp, path)


def write_shard(directory: str, shard: int, records) -> str:
  """Writes one complete shard atomically; returns its path."""
  os.makedirs(directory, exist_ok=True)
  lines = []
  for record in records:
    validate_record(record, f"record for shard {shard}")
    lines.append(json.dumps({k: _json_value(v) for k, v in record.items()},
                            allow_nan=False))
  path = shard_path(directory, shard)
  _atomic_write(path, "".join(line + "\n" for line in lines),
                kill_point="labels.shard")
  return path


def remove_partial_files(directory: str):
  """Removes the temporary files of writes a killed run left unfinished."""
  if os.path.isdir(directory):
    for name in os.listdir(directory):
      if ".tmp" in name:
        os.remove(os.path.join(directory, name))


def complete_shards(directory: str) -> list[int]:
  """Indices of the shards on disk (each one complete by construction)."""
  if not os.path.isdir(directory):
    return []
  found = [_SHARD_RE.match(name) for name in os.listdir(directory)]
  return sorted(int(m.group(1)) for m in found if m)


def validate_record(record, where: str):
  """Raises ValueError (naming `where`) if a record is malformed."""
  if not isinstance(record, dict):
    raise errors.InputError(f"{where}: expected a JSON object, got "
                            f"{type(record).__name__}.")
  for field, kind in _FIELDS.items():
    if field not in record:
      raise errors.InputError(f"{where}: missing field {field!r}.")
    value = record[field]
    if isinstance(value, bool) and kind is not bool:
      raise errors.InputError(f"{where}: field {field!r} must not be a bool.")
    if not isinstance(value, kind):
      raise errors.InputError(f"{where}: field {field!r} has type "
                              f"{type(value).__name__}.")
  num_steps = len(record["hard"])
  if num_steps < 1:
    raise errors.InputError(f"{where}: a solution has at least one step.")
  for field in ("q", "rollouts") + (("oracle",) if record["oracle"] is not None
                                    else ()):
    if len(record[field]) != num_steps:
      raise errors.InputError(
          f"{where}: field {field!r} has {len(record[field])} "
          f"entries, 'hard' has {num_steps}.")
  for q in record["q"]:
    if q is not None and not (isinstance(q, (int, float)) and
                              (math.isnan(q) or 0.0 <= q <= 1.0)):
      raise errors.InputError(
          f"{where}: q values must be in [0, 1] or null, got "
          f"{q!r}.")
  if record.get("turn_ids") is not None:
    _validate_turn_ids(record, num_steps, where)
  if any(h not in (0, 1) for h in record["hard"]):
    raise errors.InputError(f"{where}: hard labels must be 0 or 1.")
  if not all(isinstance(t, int) for t in record["response_ids"] +
             record["prompt_ids"]):
    raise errors.InputError(f"{where}: token ids must be ints.")


def _validate_turn_ids(record, num_steps: int, where: str):
  """An episode's `turn_ids`: one per response token, −1 or a turn in
  0..K−1, non-decreasing over the turns' tokens, each turn present."""
  ids = record["turn_ids"]
  if not isinstance(ids, list) or not all(
      isinstance(t, int) and not isinstance(t, bool) for t in ids):
    raise errors.InputError(f"{where}: field 'turn_ids' must be a list of "
                            "ints.")
  if len(ids) != len(record["response_ids"]):
    raise errors.InputError(
        f"{where}: field 'turn_ids' has {len(ids)} entries, 'response_ids' "
        f"has {len(record['response_ids'])}.")
  turns = [t for t in ids if t != -1]
  if (any(t < -1 for t in ids) or turns != sorted(turns) or
      sorted(set(turns)) != list(range(num_steps))):
    raise errors.InputError(
        f"{where}: field 'turn_ids' must number the {num_steps} turns 0.."
        f"{num_steps - 1} in order (−1 on observations).")


def read_shard(path: str) -> list[dict]:
  """Records of one shard; errors name the file and the 1-based line."""
  records = []
  for where, record in jsonl.iter_json_lines(path):
    validate_record(record, where)
    records.append(record)
  return records


def write_manifest(directory: str, info: dict):
  """Marks the label set complete (`info` holds counts and settings)."""
  _atomic_write(os.path.join(directory, MANIFEST),
                json.dumps(dict(info, complete=True), indent=2,
                           sort_keys=True))


def read_manifest(directory: str) -> dict:
  """The manifest of a complete label set; ValueError if there is none."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    raise errors.InputError(
        f"{directory}: not a complete label set (no {MANIFEST}; "
        "run the labels stage to the end).")
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.InputError(
        f"{path}: invalid JSON ({getattr(e, 'msg', e)}).") from None
  if not isinstance(manifest, dict) or "num_shards" not in manifest:
    raise errors.InputError(f"{path}: missing field 'num_shards'.")
  return manifest


def read_shards(directory: str, num_shards: int) -> list[dict]:
  """Records of shards 0 .. num_shards − 1, in order (all must exist)."""
  records = []
  for shard in range(num_shards):
    path = shard_path(directory, shard)
    if not os.path.exists(path):
      raise errors.InputError(
          f"{directory}: shard {shard} is missing ({path}).")
    records.extend(read_shard(path))
  return records


def read_label_set(directory: str) -> tuple[dict, list[dict]]:
  """(manifest, all records in shard order) of a complete label set.

  The manifest and the shards must agree: exactly shards 0 .. num_shards − 1
  on disk, holding `num_solutions` records (when the manifest has it).
  """
  manifest = read_manifest(directory)
  where = os.path.join(directory, MANIFEST)
  num_shards = manifest["num_shards"]
  if isinstance(num_shards, bool) or not isinstance(num_shards, int) or (
      num_shards < 1):
    raise errors.InputError(f"{where}: num_shards must be a positive integer, "
                            f"got {num_shards!r}.")
  extra = [s for s in complete_shards(directory) if s >= num_shards]
  if extra:
    raise errors.InputError(
        f"{where}: the manifest lists {num_shards} shards, but "
        f"{shard_path(directory, extra[0])} is also there (a label set "
        "written by another run?).")
  records = read_shards(directory, num_shards)
  expected = manifest.get("num_solutions")
  if expected is not None and expected != len(records):
    raise errors.InputError(
        f"{where}: the manifest counts {expected} solutions, but its "
        f"{num_shards} shards hold {len(records)}.")
  return manifest, records
