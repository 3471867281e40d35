"""The benchmark tables of docs/ are the committed results in docs/results/.

Every table of a benchmark section must be the rendering
(`experiments.benchmarks.results.render`) of a committed results file, and
each results file's rendering must be in its page (`results.TARGETS`), so a
number typed in by hand, or a results file updated without its table, fails.
"""

import glob
import json
import os

import pytest

from experiments.benchmarks import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (page, heading) of every section whose tables are benchmark results.
SECTIONS = (
    ("docs/prm_evaluation.md",
     "## Beam search against Best-of-N at equal generated tokens"),
    ("docs/reliability.md", "## Kill anywhere: resume after SIGKILL"),
    ("docs/reliability.md", "## Verifiers against hostile model output"),
    ("docs/performance.md", "## Training step against PyTorch/transformers"),
    ("docs/performance.md", "## Where the milliseconds go"),
    ("docs/performance.md", "## Micro-batches on a CPU"),
    ("docs/performance.md", "## Credit-assignment estimators against verl"),
    ("docs/performance.md", "## Sampler against transformers `generate`"),
    ("docs/performance.md",
     "## Multi-turn episodes beside the single-turn sampler"),
    ("docs/accelerator.md", "## Measured on an H200"),
)


def _read(page):
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
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


def test_every_results_file_has_its_tables_and_its_page():
  names = {os.path.splitext(os.path.basename(p))[0]
           for p in glob.glob(os.path.join(results.RESULTS_DIR, "*.json"))}
  assert names == set(results.TABLES) == set(results.TARGETS)
  for name in names:
    assert os.path.isfile(results.target_path(name)), results.TARGETS[name]


@pytest.mark.parametrize("name", sorted(results.TABLES))
def test_its_page_holds_the_tables_of_the_committed_results(name):
  page = results.TARGETS[name]
  text = _read(page)
  for block in results.render(name):
    assert block in text, f"{page} lacks, verbatim:\n{block}"


def test_the_sections_are_in_the_pages_that_hold_their_results():
  # Each page named by SECTIONS is the target of some results file, and
  # each target page has at least one checked section.
  assert {page for page, _ in SECTIONS} == set(results.TARGETS.values())


@pytest.mark.parametrize("page,heading", SECTIONS)
def test_every_table_of_a_benchmark_section_comes_from_a_results_file(
    page, heading):
  rendered = {table for name in results.TABLES
              for block in results.render(name)
              for table in _tables(block)}
  tables = _tables(_section(_read(page), heading))
  assert tables
  for table in tables:
    assert table in rendered, f"{page}, {heading}: a table not made from " \
                              f"docs/results/:\n{table}"


def test_benchmark_tables_are_not_copied_into_the_readme():
  # The README links to the pages; a copy there would go stale unchecked.
  readme = _read("README.md")
  for name in results.TABLES:
    for block in results.render(name):
      header = block.split("\n", 1)[0]
      assert header not in readme, f"README.md holds {name}'s table"


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


def test_updating_a_page_replaces_a_stale_table():
  page = _read(results.TARGETS["faults"])
  data = results.load("faults")
  row = data["runs"][0]
  stale = dict(data, runs=[dict(row, kills=row["kills"] + 1000)])
  text = results.update_doc(page, "faults", stale)
  assert f"| {row['run']} | {row['kills'] + 1000} | " in text
  assert f"| {row['run']} | {row['kills']} | " not in text
  assert results.update_doc(text, "faults", data) == page


def test_update_writes_into_the_target_page(tmp_path, capsys):
  # `--update --target=PAGE` rewrites PAGE's stale table from the JSON.
  data = results.load("train_step")
  page = tmp_path / "page.md"
  stale = dict(data, rows=[dict(data["rows"][0], ours_tok_s=1.0)])
  page.write_text("# Page\n\n" + "\n\n".join(results.render(
      "train_step", stale)) + "\n\nAfter.\n", encoding="utf-8")
  results_file = tmp_path / "train_step.json"
  results_file.write_text(json.dumps(data), encoding="utf-8")
  results.main(["results", str(results_file), "--update",
                f"--target={page}"])
  text = page.read_text(encoding="utf-8")
  assert text == ("# Page\n\n" + "\n\n".join(results.render(
      "train_step", data)) + "\n\nAfter.\n")
  assert "written into" in capsys.readouterr().out
