"""Command-line errors are one clear line, not a traceback."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _run(*args):
  return subprocess.run(
      [sys.executable, "-m", "experiments.train", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--config.rl.grop_size=3"],
     "--config.rl.grop_size: unknown key; config.rl has no 'grop_size'. "
     "Did you mean 'group_size'?"),
    (["--config.rll.steps=3"], "Did you mean 'rl'?"),
    (["--config=configs/nope.py"], "no such config file 'configs/nope.py'"),
])
def test_bad_command_line_fails_with_one_line(args, message):
  result = _run(*args)
  assert result.returncode == 2
  assert message in result.stderr
  assert "Traceback" not in result.stderr


def test_invalid_value_names_the_key(tmp_path):
  result = _run("--config.rl.group_size=0", f"--workdir={tmp_path}")
  assert result.returncode == 2
  assert "config.rl.group_size: must be a positive number" in result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args,message", [
    # absl rejects a value of the wrong type for a typed config field.
    (["--config.rl.group_size=eight"],
     "flag --config.rl.group_size=eight: invalid literal for int()"),
    # Errors of bad input raised by the run (errors.InputError): one line.
    (["--config.mesh.data=3"],
     "error: config.mesh: axis sizes {'data': 3, 'fsdp': 1, 'tensor': 1} "
     "multiply to 3, but 8 devices are available."),
])
def test_bad_values_fail_without_a_traceback(tmp_path, args, message):
  result = _run("--config=configs/default.py:size=test", *args,
                f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert message in result.stderr
  assert "Traceback" not in result.stderr
