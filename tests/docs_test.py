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
