"""Executes notebooks/quickstart.ipynb top to bottom on CPU at `test` size.

The notebook reads `RL_REWARDS_NOTEBOOK_TEST=1` (forces the `test` size) and
`RL_REWARDS_NOTEBOOK_WORKDIR` (where its runs go), so the test can check what
the notebook shows against the files its runs wrote. The kernel runs on one
CPU device, as on a Colab CPU runtime, with the repository root as its working
directory and on its PYTHONPATH.
"""

import json
import os
import re

import jax
import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _read_notebook():
  with open(NOTEBOOK) as f:
    return nbformat.read(f, as_version=4)


def _cell(notebook, cell_id):
  matches = [c for c in notebook.cells if c.get("id") == cell_id]
  assert len(matches) == 1, f"expected one cell with id {cell_id!r}"
  return matches[0]


def _stream_text(cell):
  return "".join(out.get("text", "") for out in cell.outputs
                 if out.output_type == "stream" and out.name == "stdout")


def _kernel_env(workdir):
  """The test process's environment, adapted for the notebook's kernel."""
  env = dict(os.environ)
  env["RL_REWARDS_NOTEBOOK_TEST"] = "1"
  env["RL_REWARDS_NOTEBOOK_WORKDIR"] = workdir
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  # One CPU device, like a Colab CPU runtime: drop the fake-device flag the
  # test session uses for itself.
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  # The notebook's programs are tiny and compile-bound: skipping the CPU
  # backend's optimization passes halves its cold run time.
  flags.append("--xla_backend_optimization_level=0")
  env["XLA_FLAGS"] = " ".join(flags)
  # Inline figures, whatever backend the test session uses.
  env.pop("MPLBACKEND", None)
  # Share the test session's persistent compilation cache.
  cache_dir = jax.config.jax_compilation_cache_dir
  if cache_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  return env


def _read_json(path):
  with open(path) as f:
    return json.load(f)


def test_notebook_is_stored_without_outputs():
  notebook = _read_notebook()
  nbformat.validate(notebook)
  code_cells = [c for c in notebook.cells if c.cell_type == "code"]
  assert len(code_cells) >= 8
  for cell in code_cells:
    assert cell.outputs == [], f"cell {cell.id} has stored outputs"
    assert cell.execution_count is None, f"cell {cell.id} has a count"
  # The Hugging Face example must stay off by default.
  assert re.search(r"^RUN_HF_EXAMPLE = False$", _cell(notebook, "hf").source,
                   re.MULTILINE)


@pytest.mark.slow
def test_notebook_runs_on_cpu(tmp_path):
  nbclient = pytest.importorskip("nbclient")
  notebook = _read_notebook()
  runs = str(tmp_path)
  client = nbclient.NotebookClient(
      notebook, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": ROOT}})
  client.execute(env=_kernel_env(runs))  # Raises on any failing cell.

  default_dir = os.path.join(runs, "quickstart_test")
  method_dir = os.path.join(runs, "quickstart_test_prime")
  default = _read_json(os.path.join(default_dir, "summary.json"))
  method = _read_json(os.path.join(method_dir, "summary.json"))
  assert set(default["stages"]) == {"sft", "labels", "prm", "rl"}
  assert set(method["stages"]) == {"sft", "rl"}
  method_config = _read_json(os.path.join(method_dir, "config.json"))
  assert method_config["rl"]["method"] == "prime"
  assert method_config["sft"]["init_from"] == default_dir
  assert method["stages"]["sft"]["sft/init_from"] == default_dir
  assert method["stages"]["rl"]["rl/steps"] == 1

  backend = _stream_text(_cell(notebook, "backend"))
  assert "backend cpu: 1 x" in backend and "size test" in backend
  assert "{'data': 1, 'fsdp': 1, 'tensor': 1}" in _stream_text(
      _cell(notebook, "config"))

  plots = _cell(notebook, "plots")
  assert any("image/png" in out.get("data", {}) for out in plots.outputs)

  # Samples: scored by the verifier the pipeline trained (a score-head PAV),
  # 4 problems x 2 samples, each with a verdict and its steps.
  samples = _stream_text(_cell(notebook, "samples"))
  assert "step scores from the head PRM" in samples
  headers = re.findall(r"^\S+=  \(answer \d+\): (correct|wrong|unfinished)"
                       r"   V (\d\.\d\d)$", samples, re.MULTILINE)
  assert len(headers) == 8, samples
  for _, value in headers:
    assert 0.0 <= float(value) <= 1.0
  for line in re.findall(r"^  step .*$", samples, re.MULTILINE):
    assert re.match(r"  step \d+ +(ok|WRONG) +(\d\.\d\d|  - ) ", line), line

  assert "Skipped (RUN_HF_EXAMPLE = False)" in _stream_text(
      _cell(notebook, "hf"))

  # The final table agrees with the runs' summary files.
  table = "".join(out["data"]["text/markdown"]
                  for out in _cell(notebook, "table").outputs
                  if "text/markdown" in out.get("data", {}))
  rows = [[x.strip() for x in line.strip("|").split("|")]
          for line in table.splitlines()[2:]]
  assert len(rows) == 2, table
  for row, summary, name, method_name in (
      (rows[0], default, "quickstart_test", "pav"),
      (rows[1], method, "quickstart_test_prime", "prime")):
    before = summary["stages"]["sft"]["eval/accuracy"]
    after = summary["stages"]["rl"]["eval/accuracy"]
    assert row[:6] == [name, method_name,
                       str(summary["stages"]["rl"]["rl/steps"]),
                       f"{before:.3f}", f"{after:.3f}",
                       f"{after - before:+.3f}"], row
    assert row[6] == f"{summary['stages']['rl']['eval/pass@2']:.3f}", row
