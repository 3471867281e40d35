"""Command-line plumbing shared by the `experiments/` entry points.

The one place that knows how absl and `ml_collections.config_flags` behave on
bad input. Before absl parses the command line, the config file named by
`--config=path.py[:arg]` is loaded once and every `--config.a.b=v` override is
checked against it, so an unknown key or a missing file is reported in one
line naming the key (with a did-you-mean hint) instead of a traceback from
inside ml_collections. Errors that stop a run without being a bug of the
code are reported the same way, `error: <message>` and no traceback: bad
input raised by the run itself (`errors.InputError`, which `ConfigError`
is, a missing file, a full disk; exit status 2), W&B refusing to start
(no login, or no wandb package; 2, saying how to log in or log offline),
and too many consecutive non-finite updates (`train.max_consecutive_skips`;
1). `--debug`, or `RL_REWARDS_DEBUG=1` in the environment, shows their
tracebacks too. `--config` and `--debug` are listed under each entry
point's `--help` with its own flags (`show_in_help`).
"""

import difflib
import importlib.util
import inspect
import json
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards import wandb_run


DEBUG_ENV = "RL_REWARDS_DEBUG"
CONFIG_HELP = (
    "Config file, path.py or path.py:arg (see configs/*.py). Any key of the "
    "config is set with --config.KEY=VALUE, e.g. --config.rl.steps=200 "
    "--config.rl.method=pure; an unknown key fails with the keys it knows.")


def _fail(message: str, status: int = 2):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(status)


def debug_requested(argv=None) -> bool:
  """Whether tracebacks were asked for: `--debug` or `RL_REWARDS_DEBUG=1`."""
  argv = sys.argv if argv is None else argv
  return ("--debug" in argv[1:] or "--debug=true" in argv[1:] or
          os.environ.get(DEBUG_ENV, "") not in ("", "0"))


def stop_message(error: BaseException):
  """`(one-line message, exit status)` of an error that stops a run for a
  reason that is not a bug of the code; None for any other error, whose
  traceback is shown."""
  if isinstance(error, (errors.InputError, FileNotFoundError)):
    return str(error), 2
  if isinstance(error, OSError) and errors.is_disk_full(error):
    return str(error), 2
  if type(error).__module__.split(".")[0] == "wandb":
    return f"W&B: {error} {wandb_run.LOGIN_HELP}", 2
  if isinstance(error, ModuleNotFoundError) and error.name == "wandb":
    return ("W&B: config.logging.wandb_project is set but the wandb package "
            "is not installed: pip install 'rl_rewards[wandb]' (or pip "
            "install wandb), or leave config.logging.wandb_project empty."), 2
  nonfinite = sys.modules.get("rl_rewards.train.nonfinite")
  if nonfinite is not None and isinstance(error, nonfinite.NonFiniteError):
    return str(error), 1
  return None


def reporting_errors(main):
  """`main(argv)`, with run-stopping errors (`stop_message`) printed as one
  line `error: ...` and exit status 2 (1 for non-finite updates), unless
  `debug_requested()`."""

  def wrapped(argv):
    try:
      return main(argv)
    except Exception as e:  # pylint: disable=broad-except
      stop = stop_message(e)
      if stop is None or debug_requested():
        raise
      _fail(*stop)

  return wrapped


def last_error_line(path: str, offset: int = 0) -> str:
  """The last `error: ...` line of a log from byte `offset` on, else its
  last non-empty line (a traceback's last line names the exception)."""
  if not os.path.exists(path):
    return ""
  with open(path, "rb") as f:
    f.seek(offset)
    lines = [line.strip() for line in
             f.read().decode("utf-8", "replace").splitlines() if line.strip()]
  flagged = [line for line in lines if line.startswith("error:")]
  return (flagged or lines or [""])[-1]


def failure_table(failures) -> str:
  """A markdown table of failed runs: `(name, exit status, last error line)`
  rows."""
  rows = ["| run | exit | last error line |", "|---|---|---|"]
  for name, status, line in failures:
    line = line.replace("|", "\\|")
    rows.append(f"| {name} | {status} | {line} |")
  return "\n".join(rows)


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
  """The full name of a sweep point, e.g. `rl.learning_rate=5e-05`."""
  if not overrides:
    return "base"
  return ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))


POINT_FILE = "point.json"
_POINT_DIR_CHARS = 48  # Of the values part of a point's directory name.
_MISSING = object()


def _short_value(value) -> str:
  if isinstance(value, bool):
    text = str(value).lower()
  elif isinstance(value, float):
    text = f"{value:g}"
  else:
    text = str(value)
  text = re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-")
  return text[:16] or "-"


def point_dirs(points) -> list[str]:
  """The workdir names of a sweep's points, in the grid's order.

  A name is the point's index in the grid, then the values that differ
  between points, each after the last part of its key, e.g.
  `3-alpha=0.5,prover_k=4` for `{"rl.pav.alpha": 0.5, "rl.pav.prover_k":
  4}` in a grid over both (a grid of one point shows all its values). Where
  that is longer than 48 characters, keys of several words go by their
  initials (`3-alpha=0.5,pk=4`), and what is still too long is cut (`~`).
  The index keeps names unique, also where two keys end alike or the
  values are cut; the same grid gives the same names on every run, so an
  interrupted sweep resumes its points. Each point's directory holds its
  full overrides in `point.json` (`write_point_file`).
  """
  points = [dict(p) for p in points]
  keys = sorted({k for p in points for k in p})
  if len(points) > 1:
    keys = [k for k in keys if len({repr(p.get(k, _MISSING))
                                    for p in points}) > 1]
  last = [k.split(".")[-1] for k in keys]
  short = {k: (tail if last.count(tail) == 1 else k)
           for k, tail in zip(keys, last)}

  def values_of(point, short):
    return ",".join(f"{short[k]}={_short_value(point[k])}"
                    for k in keys if k in point)

  if any(len(values_of(p, short)) > _POINT_DIR_CHARS for p in points):
    # Too long: keys of several words by their initials (learning_rate:
    # lr), unless two keys would read alike.
    initials = {k: _initials(name) for k, name in short.items()}
    if len(set(initials.values())) == len(initials):
      short = initials
  digits = len(str(max(len(points) - 1, 0)))
  names = []
  for index, point in enumerate(points):
    values = values_of(point, short)
    if len(values) > _POINT_DIR_CHARS:
      values = values[:_POINT_DIR_CHARS].rstrip(",=") + "~"
    names.append(f"{index:0{digits}d}" + (f"-{values}" if values else ""))
  return names


def _initials(name: str) -> str:
  """`drop_after_first_negative` -> `dafn`; one word stays itself."""
  words = [w for w in name.split("_") if w]
  return "".join(w[0] for w in words) if len(words) > 1 else name


def write_point_file(workdir: str, spec: str, point: dict):
  """Writes a point's config spec and full overrides to its workdir, or,
  when an earlier sweep left one there, checks that it is the same point.

  Raises:
    ConfigError: the directory holds another point (the grid changed
      since that sweep): its runs would resume the wrong point.
  """
  path = os.path.join(workdir, POINT_FILE)
  record = {"config": spec, "overrides": dict(point),
            "name": point_name(point)}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      earlier = json.load(f)
    if earlier.get("overrides") != json.loads(json.dumps(record["overrides"])):
      raise config_lib.ConfigError(
          f"sweep point {point_name(point)}: {workdir} holds the point "
          f"{earlier.get('name')!r} of an earlier grid; sweep into another "
          "--workdir (or remove that directory).")
    return
  os.makedirs(workdir, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2, sort_keys=True)
    f.write("\n")


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


def point_config(spec: str, point: dict):
  """The config of `path.py[:arg]` with a sweep point's overrides applied,
  validated (`config_lib.validate`); ConfigError names the point and key."""
  config = load_config_file(spec)
  name = point_name(point)
  for key, value in point.items():
    check_override_key(config, key)
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    try:
      setattr(node, leaf, value)  # A ConfigDict checks the value's type.
    except (TypeError, ValueError) as e:
      raise config_lib.ConfigError(
          f"sweep point {name}: config.{key}={value!r}: {e}") from None
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    raise config_lib.ConfigError(f"sweep point {name}: {e}") from None
  return config


def check_override_key(config, dotted: str):
  """Raises ConfigError if `config` has no key at the dotted path."""
  node, walked = config, []
  for part in dotted.split("."):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      if config_lib.moved_key(dotted):
        raise config_lib.ConfigError(
            f"--config.{dotted}: unknown key; it moved to "
            f"--config.{config_lib.moved_key(dotted)}.")
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
    if debug_requested():
      raise
    _fail(str(e))
  holder = config_flags.DEFINE_config_file(
      "config", default_config, CONFIG_HELP, lock_config=True)
  define_debug_flag()
  show_in_help("config")

  @reporting_errors
  def _main(argv):
    # Library INFO logs (orbax, jax) would drown the per-step status lines.
    logging.set_verbosity(logging.WARNING)
    return main(holder.value, argv)

  app.run(_main)


def define_debug_flag():
  """Defines `--debug` (read by `debug_requested`) unless it exists, and
  lists it under the entry point's `--help`."""
  if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "Show the traceback of errors that "
                      f"stop a run (also: {DEBUG_ENV}=1).")
  show_in_help("debug")


def show_in_help(*names):
  """Lists flags defined outside the entry point under its `--help`.

  absl's `--help` shows the key flags of the main module (`sys.argv[0]`):
  those it defines and those registered as key for it. `--config` (defined
  here through `config_flags`) and `--debug` would otherwise show only in
  `--helpfull`, among the flags of every imported library.
  """
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
