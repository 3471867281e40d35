"""Reading tensors from a checkpoint's safetensors files, one at a time.

A hub checkpoint holds its weights in `model.safetensors` or in shards
listed by `model.safetensors.index.json`; `TensorReader` opens each file
once, on first use, and names the file and tensor in every error (a
truncated file, a missing shard or tensor, integer weights).
"""

import json
import os

import safetensors

from rl_rewards import errors

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _open_safetensors(file):
  try:
    return safetensors.safe_open(file, framework="numpy")
  except Exception as e:  # pylint: disable=broad-except
    # E.g. "Error while deserializing header: incomplete metadata".
    raise errors.InputError(
        f"{file}: not a readable safetensors file (truncated or corrupt?): "
        f"{e}") from None


class TensorReader:
  """Reads single tensors from one or several safetensors files."""

  def __init__(self, path):
    single = os.path.join(path, WEIGHTS_FILE)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(single):
      with _open_safetensors(single) as f:
        self._file_of = {name: single for name in f.keys()}
    elif os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
      except (json.JSONDecodeError, UnicodeDecodeError, KeyError,
              TypeError) as e:
        raise errors.InputError(f"{index}: not a safetensors index with a "
                                f"'weight_map' ({e}).") from None
      self._file_of = {name: os.path.join(path, file)
                       for name, file in weight_map.items()}
      for file in sorted(set(self._file_of.values())):
        if not os.path.isfile(file):
          raise FileNotFoundError(f"{file} (listed in {index}) is missing.")
    else:
      raise FileNotFoundError(
          f"No {WEIGHTS_FILE} or {INDEX_FILE} in {path}.")
    self.source = single if os.path.isfile(single) else index
    self._handles = {}

  def __contains__(self, name):
    return name in self._file_of

  def get(self, name):
    if name not in self._file_of:
      raise errors.InputError(f"{self.source}: tensor {name!r} is missing.")
    file = self._file_of[name]
    if file not in self._handles:
      self._handles[file] = _open_safetensors(file)
    try:
      tensor = self._handles[file].get_tensor(name)
    except Exception as e:  # pylint: disable=broad-except
      # safetensors' own error names neither the file nor the index.
      raise errors.InputError(
          f"{file}: cannot read tensor {name!r} (listed for it in "
          f"{self.source}): {e}") from None
    if tensor.dtype.kind in "biu":
      raise errors.InputError(
          f"{file}: tensor {name!r} has dtype {tensor.dtype}; model weights "
          "must be floating point.")
    return tensor, file

  def close(self):
    self._handles.clear()
