"""`--help` of the entry points lists their main flags, `--config` first."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _help(module):
  result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  # (absl's --help exits with status 1.)
  assert "Try --helpfull" in result.stdout, result.stderr
  return result.stdout


def _flags(text):
  return re.findall(r"^  --(?:\[no\])?([a-z_.]+):", text, re.MULTILINE)


@pytest.mark.parametrize("module,expected", [
    ("experiments.train", {"config", "workdir", "debug"}),
    ("experiments.plan", {"config", "debug", "devices", "out"}),
    ("experiments.sweep", {"config", "workdir", "debug", "parallel"}),
])
def test_help_shows_the_config_and_main_flags(module, expected):
  text = _help(module)
  shown = _flags(text)
  assert expected <= set(shown), shown
  # Only the entry point's own flags: not the libraries' (--helpfull).
  assert len(shown) < 15, shown
  assert not any(name.startswith("config.") for name in shown)
  if module != "experiments.sweep":
    assert "--config.KEY=VALUE" in text  # How to set any key of the config.
