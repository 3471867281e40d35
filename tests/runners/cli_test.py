"""Command-line errors are one clear line, not a traceback."""

import os
import subprocess
import sys

import pytest

from rl_rewards import cli
from rl_rewards import errors
from rl_rewards import wandb_run
from rl_rewards.train import nonfinite

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


def _skip_stop():
  """Raises the error a run stops with on train.max_consecutive_skips."""
  guard = nonfinite.SkipGuard("sft", 2)
  for step in (1, 2, 3):
    guard.observe(step, 1.0)
  guard.flush()


@pytest.mark.parametrize("debug", [False, True])
def test_a_stop_on_consecutive_skips_is_one_line(capsys, monkeypatch, debug):
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  if debug:
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(nonfinite.NonFiniteError):
      cli.reporting_errors(lambda argv: _skip_stop())([])
    return
  with pytest.raises(SystemExit) as stopped:
    cli.reporting_errors(lambda argv: _skip_stop())([])
  assert stopped.value.code == 1
  assert capsys.readouterr().err == (
      "error: [sft] 2 consecutive updates had a non-finite loss or gradient "
      "and were skipped (steps 1..2); stopping at sft step 2 "
      "(config.train.max_consecutive_skips=2).\n")


def test_a_bug_keeps_its_traceback():
  with pytest.raises(KeyError):
    cli.reporting_errors(lambda argv: {}["missing"])([])


def _no_wandb_login(monkeypatch, tmp_path):
  """An environment where W&B has no API key (and cannot ask for one)."""
  pytest.importorskip("wandb")
  for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", cli.DEBUG_ENV):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # Not the working directory.
  monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))


def test_wandb_without_a_login_is_one_line(capsys, monkeypatch, tmp_path):
  _no_wandb_login(monkeypatch, tmp_path)
  monkeypatch.setattr(sys, "stdin", open(os.devnull))  # Not a terminal.
  sink = lambda: wandb_run.WandbSink(
      str(tmp_path), project="p", mode="online", state={},
      save_state=lambda state: None)
  with pytest.raises(SystemExit) as stopped:
    cli.reporting_errors(lambda argv: sink())([])
  assert stopped.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: W&B: No API key configured.")
  assert "log in with `wandb login`" in err
  assert "--config.logging.wandb_mode=offline" in err
  assert err.count("\n") == 1 and "Traceback" not in err
  # Called from Python (a notebook), the error says the same.
  with pytest.raises(errors.InputError,
                     match="`wandb login`.*--config.logging.wandb_mode="
                     "offline"):
    sink()


def test_wandb_asked_for_without_the_package_is_one_line():
  missing = ModuleNotFoundError("No module named 'wandb'", name="wandb")
  message, status = cli.stop_message(missing)
  assert status == 2
  assert message.startswith("W&B: config.logging.wandb_project is set but "
                            "the wandb package is not installed: pip install")
  assert cli.stop_message(ModuleNotFoundError("x", name="numpy")) is None


@pytest.mark.slow
def test_wandb_without_a_login_stops_a_run_with_one_line(monkeypatch,
                                                          tmp_path):
  _no_wandb_login(monkeypatch, tmp_path)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.train",
       "--config=configs/default.py:size=test",
       "--config.logging.wandb_project=p", f"--workdir={tmp_path / 'run'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      stdin=subprocess.DEVNULL)
  assert result.returncode == 2
  assert "error: W&B: No API key configured." in result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_run_stopped_by_consecutive_skips_ends_with_one_line(tmp_path):
  args = ["--config=configs/default.py:size=test", "--config.stages=sft",
          "--config.debug.nonfinite_steps=sft:1-4",
          "--config.train.max_consecutive_skips=2"]
  result = _run(*args, f"--workdir={tmp_path / 'a'}")
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: [sft] 2 consecutive updates had a non-finite loss or gradient "
      "and were skipped (steps 1..2); stopping at sft step 2 "
      "(config.train.max_consecutive_skips=2).")
  assert "Traceback" not in result.stderr
  result = _run(*args, f"--workdir={tmp_path / 'b'}", "--debug")
  assert result.returncode == 1
  assert "Traceback" in result.stderr and "NonFiniteError" in result.stderr
