"""rl_rewards/core imports only jax, numpy, chex and the standard library."""

import ast
import pathlib
import sys

import rl_rewards.core

_ALLOWED = ("jax", "numpy", "chex", "rl_rewards.core")


def _imported_modules(path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module


def test_core_imports_only_the_array_stack():
  core_dir = pathlib.Path(rl_rewards.core.__file__).parent
  files = sorted(core_dir.glob("*.py"))
  assert len(files) >= 8
  for path in files:
    for name in _imported_modules(path):
      top = name.split(".")[0]
      ok = top in sys.stdlib_module_names or any(
          name == a or name.startswith(a + ".") for a in _ALLOWED)
      assert ok, f"{path.name} imports {name}"


def test_core_modules_stay_small():
  core_dir = pathlib.Path(rl_rewards.core.__file__).parent
  for path in core_dir.glob("*.py"):
    assert len(path.read_text().splitlines()) <= 400, path.name
