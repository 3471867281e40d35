"""The worked example in docs/data_model.md is what the code computes."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(__file__))


def test_worked_example_matches_the_code():
  printed = subprocess.run(
      [sys.executable, os.path.join(ROOT, "docs", "worked_example.py")],
      capture_output=True, text=True, check=True, cwd=ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu")).stdout
  with open(os.path.join(ROOT, "docs", "data_model.md")) as f:
    doc = f.read()
  begin = doc.index("<!-- worked-example:begin -->\n") + len(
      "<!-- worked-example:begin -->\n")
  end = doc.index("<!-- worked-example:end -->")
  assert doc[begin:end] == printed


def _defined_tests(path):
  """{"name", "Class::name"} of the test functions and methods in a file."""
  import ast  # pylint: disable=g-import-not-at-top
  with open(path) as f:
    tree = ast.parse(f.read())
  names = set()
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      names.add(node.name)
    elif isinstance(node, ast.ClassDef):
      names.update(f"{node.name}::{item.name}" for item in node.body
                   if isinstance(item, ast.FunctionDef))
  return names


def test_every_row_of_the_error_table_names_tests_that_exist():
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, "docs", "errors.md")) as f:
    rows = [line for line in f if line.startswith("| ") and
            not line.startswith("| input") and "---" not in line]
  assert len(rows) >= 30
  for row in rows:
    references = re.findall(r"`(tests/[\w/]+\.py)::([\w:]+)`",
                            row.rsplit("|", 2)[-2])
    assert references, f"no test named in: {row}"
    for path, name in references:
      assert name in _defined_tests(os.path.join(ROOT, path)), (
          f"docs/errors.md names {path}::{name}, which does not exist")
