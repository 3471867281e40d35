"""The workdir's JSON files: the only writer of metrics and summaries.

A run's workdir holds `config.json` (the resolved config), `metrics.jsonl` (one
JSON object a line with `step`, `stage` and metric names such as
`eval/accuracy`, `train/reward_mean`, `perf/tokens_per_sec`) and
`summary.json` (written last: final metrics per stage and the wall time).
Summaries and configs are written atomically (temporary file + rename). When a
run resumes from a checkpoint, the metric records that the resumed steps will
produce again are dropped first, so the file never holds duplicates. In a
multi-process run only process 0 writes these files (`is_primary`); the
others compute the same numbers and skip the writes.

The same writer mirrors every record to the run's live views, set by
`config.logging`: TensorBoard event files under `<workdir>/tensorboard/`
(`rl_rewards/event_files.py`, on by default) and a Weights & Biases run
(`rl_rewards/wandb_run.py`, when `logging.wandb_project` is set). They are
opened at the first write of a process, from `metrics.jsonl` as it is then
(so what a killed run wrote but did not flush is restored), and follow every
`drop_after`, so they never show a point twice.
"""

import json
import math
import os
import sys
import time

import jax
import numpy as np

from rl_rewards import kill_points

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def _to_json_value(value):
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else value.tolist()
  if hasattr(value, "item") and callable(value.item) and np.ndim(value) == 0:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def is_primary() -> bool:
  """Whether this process writes the run's files (process 0, or the only one).

  Asks JAX for the process index only after `jax.distributed.initialize()`,
  so a single-process caller never starts a backend here.
  """
  return not jax.distributed.is_initialized() or jax.process_index() == 0


def write_json_atomic(path: str, obj):
  """Writes `obj` as JSON to `path` via a temporary file and a rename.

  Only the primary process writes (`is_primary`).
  """
  if not is_primary():
    return
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=_to_json_value)
    f.flush()
    os.fsync(f.fileno())
  kill_points.point("json.write")
  os.replace(tmp, path)


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def write_config(workdir: str, config_dict: dict):
  write_json_atomic(os.path.join(workdir, CONFIG_FILE), config_dict)


def read_metrics(workdir: str) -> list[dict]:
  """All records of `metrics.jsonl` (a torn last line is ignored)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue  # A record cut short by a kill; it will be written again.
  return records


def _cut_torn_tail(path: str):
  """Removes a last line cut short by a kill, so appends start a new line."""
  if not os.path.exists(path):
    return
  with open(path, "rb+") as f:
    data = f.read()
    if data and not data.endswith(b"\n"):
      f.truncate(data.rfind(b"\n") + 1)


def scalar_value(value):
  """A metric value as a float, or None if it is not a number.

  Non-finite floats come back from the strings they are stored as.
  """
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, float)):
    return float(value)
  if isinstance(value, str) and value in ("nan", "inf", "-inf"):
    return float(value)
  return None


def scalar_entry(record: dict):
  """`(stage, step, wall_time, {metric: float})` of a metrics record: what
  the live views plot (strings, flags and lists are left out)."""
  scalars = {}
  for key, value in record.items():
    if key in ("stage", "step", "time"):
      continue
    number = scalar_value(value)
    if number is not None:
      scalars[key] = number
  return (str(record.get("stage")), int(record.get("step", 0)),
          float(record.get("time", 0.0)), scalars)


def _logging_value(logging, key, default):
  if logging is None:
    return default
  return logging.get(key, default)


class MetricsWriter:
  """Appends metric records to `<workdir>/metrics.jsonl` and mirrors them to
  the live views (primary process only; on the other processes every method
  does nothing).

  `num_records` counts the file's complete records; checkpoints store it, so
  a resumed stage can `truncate` the file back to what it held when its
  checkpoint was written (`runners/resume.py`).

  Args:
    workdir: the run's directory.
    logging: `config.logging` (or a dict with its keys); None: only
      `metrics.jsonl`.
    stage_order: the run's stages in order. With it, a stage's first write
      in a process that did not `drop_after` for it (a stage that starts
      over, having no checkpoint) first drops that stage's records and the
      later stages' left by an earlier, killed attempt.
    run_config: the resolved config as a dict (the W&B run's config).
  """

  def __init__(self, workdir: str, *, logging=None, stage_order=None,
               run_config: dict | None = None):
    self._workdir = workdir
    self._path = os.path.join(workdir, METRICS_FILE)
    self._logging = logging
    self._stage_order = list(stage_order or [])
    self._run_config = run_config
    self._sinks = None  # Opened at the first write or drop_after.
    self._declared = set()  # Stages that started writing in this process.
    self._file = None
    self.num_records = 0
    if is_primary():
      _cut_torn_tail(self._path)
      self.num_records = len(read_metrics(workdir))
      self._file = open(self._path, "a")

  def _make_sinks(self):
    sinks = []
    if _logging_value(self._logging, "tensorboard", False):
      from rl_rewards import event_files  # pylint: disable=g-import-not-at-top
      sinks.append(event_files.EventFileSink(
          os.path.join(self._workdir, event_files.DIRNAME)))
    project = _logging_value(self._logging, "wandb_project", "")
    if project:
      from rl_rewards import wandb_run  # pylint: disable=g-import-not-at-top
      state_path = os.path.join(self._workdir, wandb_run.STATE_FILE)
      sinks.append(wandb_run.WandbSink(
          self._workdir, project=project,
          state=(read_json(state_path) if os.path.exists(state_path)
                 else {}),
          save_state=lambda state: write_json_atomic(state_path, state),
          entity=_logging_value(self._logging, "wandb_entity", ""),
          mode=_logging_value(self._logging, "wandb_mode", "online"),
          config=self._run_config))
    return sinks

  def _sync_sinks(self, records):
    """Opens the live views if needed and makes them hold `records`."""
    if self._sinks is None:
      self._sinks = self._make_sinks()
    if self._sinks:
      entries = [scalar_entry(r) for r in records]
      for sink in self._sinks:
        sink.replace(entries)

  def _rewrite(self, keep: list[dict]):
    self._file.close()
    tmp = self._path + ".tmp"
    with open(tmp, "w") as f:
      for record in keep:
        f.write(json.dumps(record, default=_to_json_value) + "\n")
    os.replace(tmp, self._path)
    self._file = open(self._path, "a")
    self.num_records = len(keep)
    self._sync_sinks(keep)

  def truncate(self, num_records: int):
    """Keeps the first `num_records` records and drops the rest."""
    if self._file is None:
      return
    self._file.flush()
    records = read_metrics(os.path.dirname(self._path))
    if len(records) > num_records:
      self._rewrite(records[:num_records])

  def drop_after(self, stage_order: list[str], stage: str, step: int):
    """Drops records that a resume from `(stage, step)` will produce again.

    Keeps records of earlier stages and of `stage` up to `step`; drops records
    of `stage` after `step` and of all later stages. The live views are
    rewritten to match.
    """
    if self._file is None:
      return
    self._declared.add(stage)
    self._file.flush()
    rank = {name: i for i, name in enumerate(stage_order)}
    keep = []
    for record in read_metrics(self._workdir):
      r_stage = record.get("stage")
      if r_stage not in rank:
        keep.append(record)
      elif rank[r_stage] < rank[stage]:
        keep.append(record)
      elif r_stage == stage and record.get("step", 0) <= step:
        keep.append(record)
    self._rewrite(keep)

  def write(self, stage: str, step: int, metrics: dict):
    if self._file is None:
      return
    if stage not in self._declared:
      self._declared.add(stage)
      if stage in self._stage_order:
        later = set(self._stage_order[self._stage_order.index(stage):])
        if any(r.get("stage") in later for r in read_metrics(self._workdir)):
          # Records of an attempt that stopped before its first checkpoint.
          self.drop_after(self._stage_order, stage, -1)
    if self._sinks is None:
      self._sync_sinks(read_metrics(self._workdir))
    record = {"stage": stage, "step": int(step), "time": time.time()}
    record.update({k: _to_json_value(v) for k, v in metrics.items()})
    line = json.dumps(record, default=_to_json_value) + "\n"
    kill_points.point("metrics.write", before_kill=lambda: (
        self._file.write(line[:len(line) // 2]), self._file.flush()))
    self._file.write(line)
    self._file.flush()
    self.num_records += 1
    entry = scalar_entry(record)
    for sink in self._sinks:
      sink.write(*entry)

  def close(self):
    if self._file is not None:
      self._file.close()
      self._file = None
    for sink in self._sinks or ():
      sink.close()
    self._sinks = None


def write_summary(workdir: str, summary: dict):
  write_json_atomic(os.path.join(workdir, SUMMARY_FILE), summary)


def format_status(stage: str, step: int, total: int, metrics: dict,
                  keys: tuple[str, ...]) -> str:
  """One human-readable status line, e.g. for each training step.

  Updates skipped for a non-finite loss or gradient (`*skipped_updates`
  keys, the run's counts so far) are appended when there are any.
  """
  parts = [f"[{stage}] step {step}/{total}"]
  keys = tuple(keys) + tuple(
      k for k in sorted(metrics) if k.endswith("skipped_updates") and
      k not in keys and _to_json_value(metrics[k]))
  for key in keys:
    if key in metrics:
      value = _to_json_value(metrics[key])
      short = key.split("/")[-1]
      if isinstance(value, float):
        parts.append(f"{short} {value:.4g}")
      else:
        parts.append(f"{short} {value}")
  return "  ".join(parts)


def print_status(line: str):
  print(line, flush=True, file=sys.stdout)
