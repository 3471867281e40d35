"""Command-line plumbing shared by the `experiments/` entry points.

The one place that knows how absl and `ml_collections.config_flags` behave on
bad input. Before absl parses the command line, the config file named by
`--config=path.py[:arg]` is loaded once and every `--config.a.b=v` override is
checked against it, so an unknown key or a missing file is reported in one
line naming the key (with a did-you-mean hint) instead of a traceback from
inside ml_collections. Errors of bad input raised by the run itself
(`errors.InputError`, which `ConfigError` is, a missing file, a full disk)
are reported the same way.
"""

import difflib
import importlib.util
import inspect
import os
import sys

from absl import app
from absl import logging
from ml_collections import config_flags

from rl_rewards import config_lib
from rl_rewards import errors


def _fail(message: str):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def _config_arg(argv, default):
  """The `--config` value on the command line, or `default`."""
  for i, arg in enumerate(argv[1:], start=1):
    if arg.startswith("--config="):
      return arg[len("--config="):]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return default


def load_config_file(spec: str):
  """Loads `path.py[:arg]` and returns its `get_config(arg)`."""
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    raise config_lib.ConfigError(f"--config: no such config file {path!r}.")
  module_spec = importlib.util.spec_from_file_location("_config_file", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise config_lib.ConfigError(f"--config: {path} defines no get_config().")
  return module.get_config(arg) if arg else module.get_config()


def point_name(overrides: dict) -> str:
  """The workdir name of a sweep point, e.g. `rl.learning_rate=5e-05`."""
  if not overrides:
    return "base"
  return ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def load_sweep(spec: str):
  """The list of override dicts of `path.py[:arg]`'s `get_sweep()`.

  A `get_sweep(arg)` that takes a parameter gets the spec's `arg` (the same
  string `get_config` gets), so one config file can hold several grids.

  Every key of every point is checked against the config, so a typo fails
  before any run starts.
  """
  path = spec.partition(":")[0]
  config = load_config_file(spec)  # Fails clearly on a bad path or config.
  module_spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise config_lib.ConfigError(f"--config: {path} defines no get_sweep().")
  arg = spec.partition(":")[2]
  takes_arg = bool(inspect.signature(module.get_sweep).parameters)
  grid = module.get_sweep(arg or None) if takes_arg else module.get_sweep()
  points = [dict(point) for point in grid]
  for point in points:
    for key in point:
      check_override_key(config, key)
  return points


def check_override_key(config, dotted: str):
  """Raises ConfigError if `config` has no key at the dotted path."""
  node, walked = config, []
  for part in dotted.split("."):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      where = "config" + "".join(f".{w}" for w in walked)
      hint = difflib.get_close_matches(part, keys, n=1)
      hint = f" Did you mean {hint[0]!r}?" if hint else ""
      known = f" Known keys: {', '.join(sorted(keys))}." if keys else ""
      raise config_lib.ConfigError(
          f"--config.{dotted}: unknown key; {where} has no {part!r}.{hint}"
          f"{known}")
    node = node[part]
    walked.append(part)


def _precheck(argv, default_config):
  spec = _config_arg(argv, default_config)
  if spec is None:
    return
  config = load_config_file(spec)
  for arg in argv[1:]:
    if arg.startswith("--config."):
      check_override_key(config, arg[len("--config."):].split("=", 1)[0])


def run(main, *, default_config: str | None = "configs/default.py"):
  """Defines the locked `--config` flag and runs `main(config, argv)`.

  Args:
    main: the entry point; receives the resolved ConfigDict (locked, with
      command-line overrides applied) and the remaining argv.
    default_config: the config file used when `--config` is not given.
  """
  try:
    _precheck(sys.argv, default_config)
  except config_lib.ConfigError as e:
    _fail(str(e))
  holder = config_flags.DEFINE_config_file(
      "config", default_config, "Experiment config file (configs/*.py).",
      lock_config=True)

  def _main(argv):
    # Library INFO logs (orbax, jax) would drown the per-step status lines.
    logging.set_verbosity(logging.WARNING)
    try:
      return main(holder.value, argv)
    except (errors.InputError, FileNotFoundError) as e:
      _fail(str(e))
    except OSError as e:
      if not errors.is_disk_full(e):
        raise
      _fail(str(e))

  app.run(_main)
