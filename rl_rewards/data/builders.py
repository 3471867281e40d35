"""tensorflow-datasets builders, written as array_record (no TensorFlow).

Four builders prepare datasets with the shared record layout

  question: Text, answer: Text, solution: Text, index: int64

(plus `num_ops` for the arithmetic task and `metadata`, a JSON string, for
reasoning-gym):

* `Gsm8kJsonl` and `MathJsonl`: JSONL files given per split;
* `ArithProblems`: n problems per split of the embedded arithmetic task;
  record i of split s is `arith.make_problem(task, i, s)`;
* `ReasoningGymTask`: any reasoning-gym dataset by name.

Use the functions at the bottom (`gsm8k_jsonl`, `math_jsonl`,
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

from rl_rewards.data import jsonl
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

  def _generate_examples(self, split):
    for record in self._records(split):
      yield record["index"], record


@dataclasses.dataclass
class JsonlConfig(tfds.core.BuilderConfig):
  """A JSONL dataset: one file per split."""
  split_files: dict = dataclasses.field(default_factory=dict)

  @property
  def splits(self):
    return list(self.split_files)


class Gsm8kJsonl(_Builder):
  """GSM8K-format JSONL files (`question`, `answer` with "#### x")."""

  def _info(self):
    return self.dataset_info_from_configs(features=_text_features(),
                                          disable_shuffling=True)

  def _records(self, split):
    return jsonl.read_gsm8k_jsonl(self.builder_config.split_files[split])


class MathJsonl(_Builder):
  """MATH-format JSONL files (`problem`, `solution` with \\boxed{x})."""

  def _info(self):
    return self.dataset_info_from_configs(features=_text_features(),
                                          disable_shuffling=True)

  def _records(self, split):
    return jsonl.read_math_jsonl(self.builder_config.split_files[split])


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


def _jsonl_builder(builder_cls, split_files, data_dir, name_prefix, reader):
  _check_splits(split_files, builder_cls.__name__)
  split_files = {split: str(path) for split, path in split_files.items()}
  contents = []
  for split, path in sorted(split_files.items()):
    reader(path)  # Validate before anything is written.
    with open(path, "rb") as f:
      contents.append(split.encode() + b"\0" + f.read())
  config = JsonlConfig(name=f"{name_prefix}-{_fingerprint(*contents)}",
                       split_files=split_files)
  return prepare(builder_cls(config=config, data_dir=data_dir,
                             file_format=FILE_FORMAT))


def gsm8k_jsonl(split_files: Mapping[str, str], data_dir: str):
  """A prepared `Gsm8kJsonl` builder for {split: path}."""
  return _jsonl_builder(Gsm8kJsonl, split_files, data_dir, "files",
                        jsonl.read_gsm8k_jsonl)


def math_jsonl(split_files: Mapping[str, str], data_dir: str):
  """A prepared `MathJsonl` builder for {split: path}."""
  return _jsonl_builder(MathJsonl, split_files, data_dir, "files",
                        jsonl.read_math_jsonl)


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
