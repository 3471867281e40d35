"""The error type of bad input: configs, data files, checkpoints, mesh shapes.

`InputError` (a `ValueError`) means "the input is wrong, the code is not":
its message names the config key, file (and line) or checkpoint at fault and
says what was expected. The command-line entry points print it as one line,
without a traceback (`rl_rewards.cli`); `ConfigError` (also reached as
`config_lib.ConfigError`) is the one of a config value.
docs/errors.md lists the cases and the tests that check them.

`disk_full(path, error)` turns an out-of-space `OSError` into one that says
so and names the path being written.
"""

import errno


class InputError(ValueError):
  """Bad input, reported with the key, file or line at fault."""


class ConfigError(InputError):
  """A config value is missing, has the wrong type, or is out of range."""


def is_disk_full(error: BaseException) -> bool:
  """Whether `error`, or an exception it was raised from, is ENOSPC/EDQUOT."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC,
                                                      errno.EDQUOT):
      return True
    if "No space left on device" in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def disk_full(path: str, intact: str = "") -> OSError:
  """An ENOSPC error naming `path`; `intact` says what is still usable."""
  message = f"disk full while writing {path}"
  if intact:
    message += f"; {intact}"
  return OSError(errno.ENOSPC, message + ". Free space and rerun.")
