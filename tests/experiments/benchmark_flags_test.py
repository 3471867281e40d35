"""Every benchmark module can be imported into one process (the test
session imports several): flags they share may override each other."""

import importlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_all_benchmark_modules_import_together():
  names = sorted(f[:-3] for f in os.listdir(
      os.path.join(ROOT, "experiments", "benchmarks"))
                 if f.endswith(".py") and f != "__init__.py" and
                 not f.endswith("_peer.py"))  # Peers run in their own venv.
  assert {"advantages", "faults", "hostile", "sampler",
          "train_step"} <= set(names)
  for name in names:
    importlib.import_module(f"experiments.benchmarks.{name}")
