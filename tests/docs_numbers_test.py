"""README's benchmark tables are the committed results in docs/results/.

Every table of the README's benchmark sections must be the rendering
(`experiments.benchmarks.results.render`) of a committed results file, so a
number typed in by hand, or a results file updated without its table, fails.
"""

import glob
import json
import os

import pytest

from experiments.benchmarks import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
# The README sections whose tables are benchmark results.
SECTIONS = ("### Beam search against Best-of-N at equal generated tokens",
            "### Kill anywhere: resume after SIGKILL",
            "### Verifiers against hostile model output",
            "### Training step against PyTorch/transformers",
            "### Credit-assignment estimators against verl",
            "### Sampler against transformers `generate`")


def _readme():
  with open(README, encoding="utf-8") as f:
    return f.read()


def _section(text, heading):
  start = text.index(heading + "\n")
  end = text.find("\n#", start + len(heading))
  return text[start:end if end >= 0 else len(text)]


def _tables(text):
  """Every markdown table (consecutive lines starting with '|') of `text`."""
  tables, current = [], []
  for line in text.split("\n") + [""]:
    if line.startswith("|"):
      current.append(line)
    elif current:
      tables.append("\n".join(current))
      current = []
  return tables


def test_every_results_file_has_its_tables():
  names = {os.path.splitext(os.path.basename(p))[0]
           for p in glob.glob(os.path.join(results.RESULTS_DIR, "*.json"))}
  assert names == set(results.TABLES)


@pytest.mark.parametrize("name", sorted(results.TABLES))
def test_the_readme_holds_the_tables_of_the_committed_results(name):
  readme = _readme()
  for block in results.render(name):
    assert block in readme, f"README.md lacks, verbatim:\n{block}"


@pytest.mark.parametrize("heading", SECTIONS)
def test_every_table_of_a_benchmark_section_comes_from_a_results_file(
    heading):
  rendered = {table for name in results.TABLES
              for block in results.render(name)
              for table in _tables(block)}
  tables = _tables(_section(_readme(), heading))
  assert tables
  for table in tables:
    assert table in rendered, f"{heading}: a table not made from " \
                              f"docs/results/:\n{table}"


def test_measured_results_say_where_and_when():
  for path in glob.glob(os.path.join(results.RESULTS_DIR, "*.json")):
    with open(path, encoding="utf-8") as f:
      provenance = json.load(f)["provenance"]
    if "transcribed_from" in provenance:
      assert len(provenance["transcribed_from"]) == 40, path
      continue
    assert len(provenance["revision"]) == 40, path
    assert provenance["machine"]["cores"] >= 1, path
    assert {"cpu", "python", "jax"} <= set(provenance["machine"]), path
    assert len(provenance["load_average_start"]) == 3, path
    assert provenance["date"][:2] == "20", path


def test_updating_the_readme_replaces_a_stale_table():
  data = results.load("search")
  stale = dict(data, rows=[dict(data["rows"][0], cells=["0.1", "0.2", "0.3",
                                                        "0.4"])])
  text = results.update_readme(_readme(), "search", stale)
  assert "| oracle PAV: accuracy (tokens/problem) | 0.1 | 0.2 | 0.3 | 0.4 |" \
      in text
  assert "| oracle PRM: efficiency |" not in text
  assert results.update_readme(text, "search", data) == _readme()
