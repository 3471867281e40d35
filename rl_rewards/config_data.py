"""The data keys of a config: the layout of a text task's files and the
held-out sets (`task.preset`, `task.fields`, `eval.sets`).

`config_lib.validate` checks them with `validate_text_data`; the runners read
the parsed values (`task_fields`, `eval_sets`). Errors are `ConfigError`
naming the key (and the bad entry).
"""

import dataclasses
import re

from rl_rewards import errors
from rl_rewards.data import readers


def _require(condition, key, message):
  if not condition:
    raise errors.ConfigError(f"config.{key}: {message}")


# Tasks that read question/answer files (`task.train_path`, `eval_path`).
FILE_TASKS = ("gsm8k", "math")
_SET_NAME_RE = re.compile(r"[A-Za-z0-9_]+")


def task_fields(task) -> readers.FieldMap:
  """The field map of a file task's data (`task.preset` + `task.fields`).

  Raises:
    ConfigError naming task.preset or task.fields.
  """
  preset = task.preset or task.name
  if readers.preset_name(preset) is None:
    raise errors.ConfigError(
        f"config.task.preset: unknown preset {preset!r}; one of "
        f"{sorted(readers.PRESETS) + sorted(readers.PRESET_ALIASES)}.")
  try:
    return readers.field_map(preset, task.fields)
  except ValueError as e:
    raise errors.ConfigError(f"config.task.fields: {e}") from None


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """One entry of `eval.sets`: a held-out file and how to read it."""
  name: str
  path: str
  fields: readers.FieldMap


def eval_sets(config) -> list[EvalSet]:
  """Parses `eval.sets` ("NAME:PATH" or "NAME:PRESET:PATH", comma-separated).

  Raises:
    ConfigError naming eval.sets and the bad entry.
  """
  out = []
  for entry in (e.strip() for e in config.eval.sets.split(",")):
    if not entry:
      continue
    bad = f"config.eval.sets: bad entry {entry!r}; "
    name, sep, rest = entry.partition(":")
    name = name.strip()
    if not sep or not rest.strip():
      raise errors.ConfigError(
          bad + "expected NAME:PATH or NAME:PRESET:PATH.")
    if not _SET_NAME_RE.fullmatch(name):
      raise errors.ConfigError(bad + "NAME must match [A-Za-z0-9_]+.")
    if any(s.name == name for s in out):
      raise errors.ConfigError(bad + f"the name {name!r} is used twice.")
    preset, sep, path = rest.partition(":")
    if not sep or readers.preset_name(preset) is None:
      # NAME:PATH (a path may hold ":").
      preset, path = "", rest
    path = path.strip()
    if not path:
      raise errors.ConfigError(bad + "the path is empty.")
    if not preset and readers.preset_name(name) is not None:
      preset = name
    if preset:
      fields = readers.PRESETS[readers.preset_name(preset)]
    elif config.task.name not in FILE_TASKS:
      raise errors.ConfigError(
          bad + f"the {config.task.name} task reads no files: name the "
          "layout (NAME:PRESET:PATH).")
    else:
      try:
        fields = task_fields(config.task)
      except errors.ConfigError as e:
        raise errors.ConfigError(
            f"{bad}it takes the task's layout, which is bad: {e}") from None
    out.append(EvalSet(name=name, path=path, fields=fields))
  return out


def validate_text_data(config, stages):
  """Checks the data keys of text tasks (syntax only; the files:
  runners/tasks.py) for a config running `stages`."""
  task = config.task
  if task.name in FILE_TASKS:
    fields = task_fields(task)
    for stage in ("sft", "sft_continue"):
      _require(stage not in stages or
               (stage == "sft" and config.sft.init_from) or
               fields.has_solution, "task.fields",
               f"the {stage} stage trains on reference solutions, but the "
               f"layout (task.preset={task.preset or task.name!r}, "
               f"task.fields={task.fields!r}) has none; map one with "
               "task.fields=solution=PATH or drop the stage.")
  else:
    for key in ("preset", "fields"):
      _require(not task[key], f"task.{key}",
               f"only for file tasks ({', '.join(FILE_TASKS)}), not "
               f"{task.name!r}.")
  _require(not config.eval.sets.replace(",", "").strip() or
           task.name != "arith",
           "eval.sets", "held-out sets are for text tasks (gsm8k, math, "
           "reasoning_gym).")
  eval_sets(config)
  _require(config.eval.sets_samples >= 0, "eval.sets_samples",
           f"must be >= 0 (0: eval.pass_n), got {config.eval.sets_samples}.")
  _require(config.eval.sets_samples == 0 or
           config.eval.sets_samples >= config.eval.pass_n,
           "eval.sets_samples", f"must be >= eval.pass_n "
           f"({config.eval.pass_n}) for pass@{config.eval.pass_n}, got "
           f"{config.eval.sets_samples}.")
  _require(config.eval.sets_size >= 0, "eval.sets_size",
           f"must be >= 0 (0: every problem), got {config.eval.sets_size}.")
  _require(config.eval.sets_temperature > 0, "eval.sets_temperature",
           f"must be > 0 (pass@k samples), got "
           f"{config.eval.sets_temperature}.")
