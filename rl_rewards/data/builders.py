"""tensorflow-datasets builders, written as array_record (no TensorFlow).

Four builders prepare datasets with the shared record layout

  question: Text, answer: Text, solution: Text, index: int64

(plus `num_ops` for the arithmetic task and `metadata`, a JSON string, for
reasoning-gym):

* `TextFiles`: question/answer files given per split, in any format and
  layout of `rl_rewards.data.readers` (JSONL, JSON, Parquet, Parquet shards;
  a `FieldMap` or preset such as gsm8k or math);
* `ArithProblems`: n problems per split of the embedded arithmetic task;
  record i of split s is `arith.make_problem(task, i, s)`;
* `ReasoningGymTask`: any reasoning-gym dataset by name.

Use the functions at the bottom (`text_files`, `gsm8k_jsonl`, `math_jsonl`,
`arith_problems`, `reasoning_gym_task`): they name the builder config after a
fingerprint of its content (file bytes, generator parameters), so a changed
input is prepared anew instead of silently reusing stale records, and return
a prepared builder. Read a split with `data_source(builder, split)` (random
access, records are dicts of numpy values and bytes); `tfds.load` needs
TensorFlow and is not used. Records keep their generation order.
"""

import dataclasses
import hashlib
import json
import re
from typing import Mapping

import numpy as np
import tensorflow_datasets as tfds

from absl import logging

from rl_rewards.data import readers
from rl_rewards.tasks import arith
from rl_rewards.tasks import reasoning_gym_tasks

FILE_FORMAT = "array_record"
_SPLIT_NAME_RE = re.compile(r"[A-Za-z0-9_]+")


def _text_features(**extra):
  return tfds.features.FeaturesDict({
      "question": tfds.features.Text(),
      "answer": tfds.features.Text(),
      "solution": tfds.features.Text(),
      "index": np.int64,
      **extra,
  })


def _check_splits(split_items: Mapping, what: str) -> None:
  if not split_items:
    raise ValueError(f"{what}: need at least one split.")
  for split in split_items:
    if not isinstance(split, str) or not _SPLIT_NAME_RE.fullmatch(split):
      raise ValueError(f"{what}: split names must match [A-Za-z0-9_]+, got "
                       f"{split!r}.")


def _fingerprint(*parts) -> str:
  digest = hashlib.sha256()
  for part in parts:
    digest.update(part if isinstance(part, bytes) else
                  json.dumps(part, sort_keys=True, default=str).encode())
  return digest.hexdigest()[:16]


class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared settings of the builders here."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  # tfds looks for checksum files next to the builder's code, which imports
  # the optional `importlib_resources` package; these builders download
  # nothing.
  code_path = None

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split)
            for split in self.builder_config.splits}

  def _records(self, split):
    raise NotImplementedError

  # tfds words these for datasets fetched from the web ("downloaded and
  # prepared"); ours are read from local files or generated, never
  # downloaded.
  def _source(self) -> str:
    """Where the records come from, for the log lines."""
    raise NotImplementedError

  def _log_download_bytes(self):
    logging.info("Preparing %s (%s) from %s into %s ...", self.name,
                 self.builder_config.name, self._source(), self.data_dir)

  def _log_download_done(self):
    logging.info("Prepared %s (%s) from %s into %s (nothing downloaded); "
                 "later runs reuse it.", self.name, self.builder_config.name,
                 self._source(), self.data_dir)

  def _generate_examples(self, split):
    for record in self._records(split):
      yield record["index"], record


@dataclasses.dataclass
class TextFilesConfig(tfds.core.BuilderConfig):
  """Question/answer files, one per split, and where their fields are."""
  split_files: dict = dataclasses.field(default_factory=dict)
  fields: dict = dataclasses.field(default_factory=dict)  # A FieldMap.

  @property
  def splits(self):
    return list(self.split_files)


class TextFiles(_Builder):
  """Question/answer files (`readers.read_records` with a FieldMap)."""

  def _info(self):
    return self.dataset_info_from_configs(features=_text_features(),
                                          disable_shuffling=True)

  def _source(self):
    return "local files " + ", ".join(
        f"{split}: {path}"
        for split, path in sorted(self.builder_config.split_files.items()))

  def _records(self, split):
    return readers.read_records(self.builder_config.split_files[split],
                                readers.FieldMap(**self.builder_config.fields))


@dataclasses.dataclass
class ArithDataConfig(tfds.core.BuilderConfig):
  """The arithmetic task: its generator config and problems per split."""
  task: arith.ArithConfig = dataclasses.field(
      default_factory=arith.ArithConfig)
  split_sizes: dict = dataclasses.field(default_factory=dict)

  @property
  def splits(self):
    return list(self.split_sizes)


class ArithProblems(_Builder):
  """Problems 0..n-1 of each split of the embedded arithmetic task."""

  def _info(self):
    return self.dataset_info_from_configs(
        features=_text_features(num_ops=np.int64), disable_shuffling=True)

  def _source(self):
    return "the embedded arithmetic task's generator"

  def _records(self, split):
    task = self.builder_config.task
    for index in range(self.builder_config.split_sizes[split]):
      problem = arith.make_problem(task, index, split)
      yield {"question": problem.question, "answer": str(problem.answer),
             "solution": arith.reference_solution(problem), "index": index,
             "num_ops": problem.num_ops}


@dataclasses.dataclass
class ReasoningGymConfig(tfds.core.BuilderConfig):
  """A reasoning-gym dataset: its name, examples per split and seed."""
  task_name: str = ""
  split_sizes: dict = dataclasses.field(default_factory=dict)
  seed: int = 0

  @property
  def splits(self):
    return list(self.split_sizes)

  def split_seed(self, split: str) -> int:
    return int(_fingerprint(self.seed, split), 16) % (2**31)


class ReasoningGymTask(_Builder):
  """Any reasoning-gym dataset; `metadata` holds the entry's metadata JSON.

  Each split is drawn with its own seed (a hash of the config seed and the
  split name); reasoning-gym does not promise that two seeds give disjoint
  examples.
  """

  def _info(self):
    return self.dataset_info_from_configs(
        features=_text_features(metadata=tfds.features.Text()),
        disable_shuffling=True)

  def _source(self):
    return f"reasoning-gym's {self.builder_config.task_name!r} generator"

  def _records(self, split):
    config = self.builder_config
    dataset = reasoning_gym_tasks.create_dataset(
        config.task_name, config.split_sizes[split], config.split_seed(split))
    for index in range(config.split_sizes[split]):
      entry = dataset[index]
      yield {"question": str(entry["question"]),
             "answer": str(entry["answer"]), "solution": "", "index": index,
             "metadata": json.dumps(entry.get("metadata", {}),
                                    sort_keys=True, default=str)}


def prepare(builder, show_progress: bool = False):
  """Prepares `builder` as array_record (a no-op when already prepared)."""
  # pylint: disable-next=protected-access
  was_active = getattr(tfds.core.utils.tqdm_utils, "_active", True)
  tfds.display_progress_bar(show_progress)
  try:
    builder.download_and_prepare(file_format=FILE_FORMAT)
  finally:
    tfds.display_progress_bar(was_active)
  return builder


def data_source(builder, split: str):
  """Random-access source of one prepared split (len, [i] -> dict)."""
  if split not in builder.info.splits:
    raise ValueError(f"split {split!r} not in {builder.name} "
                     f"(has {sorted(builder.info.splits)}).")
  return builder.as_data_source(split=split)


def text_files(split_files: Mapping[str, str], data_dir: str,
               fields: readers.FieldMap):
  """A prepared `TextFiles` builder for {split: path} read with `fields`.

  Every file is read and checked before anything is written; the builder is
  named after a digest of the files' bytes and the field map, so a changed
  file or mapping is prepared anew.
  """
  _check_splits(split_files, "TextFiles")
  split_files = {split: str(path) for split, path in split_files.items()}
  contents = [dataclasses.asdict(fields)]
  for split, path in sorted(split_files.items()):
    readers.read_records(path, fields)  # Validate before anything is written.
    contents.append(split.encode() + b"\0" + readers.fingerprint(path))
  config = TextFilesConfig(name=f"files-{_fingerprint(*contents)}",
                           split_files=split_files,
                           fields=dataclasses.asdict(fields))
  return prepare(TextFiles(config=config, data_dir=data_dir,
                           file_format=FILE_FORMAT))


def gsm8k_jsonl(split_files: Mapping[str, str], data_dir: str):
  """A prepared `TextFiles` builder of GSM8K-layout files for {split: path}."""
  return text_files(split_files, data_dir, readers.PRESETS["gsm8k"])


def math_jsonl(split_files: Mapping[str, str], data_dir: str):
  """A prepared `TextFiles` builder of MATH-layout files for {split: path}."""
  return text_files(split_files, data_dir, readers.PRESETS["math"])


def arith_problems(task: arith.ArithConfig, split_sizes: Mapping[str, int],
                   data_dir: str):
  """A prepared `ArithProblems` builder with n problems per split."""
  _check_splits(split_sizes, "ArithProblems")
  for split, size in split_sizes.items():
    if int(size) < 1:
      raise ValueError(f"ArithProblems: split {split!r} size must be >= 1.")
  split_sizes = {k: int(v) for k, v in split_sizes.items()}
  name = "task-" + _fingerprint(dataclasses.asdict(task), split_sizes)
  config = ArithDataConfig(name=name, task=task, split_sizes=split_sizes)
  return prepare(ArithProblems(config=config, data_dir=data_dir,
                               file_format=FILE_FORMAT))


def reasoning_gym_task(task_name: str, split_sizes: Mapping[str, int],
                       seed: int, data_dir: str):
  """A prepared `ReasoningGymTask` builder for one reasoning-gym dataset."""
  _check_splits(split_sizes, "ReasoningGymTask")
  split_sizes = {k: int(v) for k, v in split_sizes.items()}
  # Fail on an unknown name before preparing anything.
  reasoning_gym_tasks.create_dataset(task_name, 1, seed)
  name = f"{task_name}-" + _fingerprint(task_name, split_sizes, seed)
  config = ReasoningGymConfig(name=name, task_name=task_name,
                              split_sizes=split_sizes, seed=seed)
  return prepare(ReasoningGymTask(config=config, data_dir=data_dir,
                                  file_format=FILE_FORMAT))
