"""The docs are what the code does.

The worked example in docs/data_model.md is what the code prints; every row
of docs/errors.md names tests that exist; and every command quoted in
README.md or docs/*.md still parses (see "Commands quoted in docs" below).
"""

import ast
import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from rl_rewards import cli
from rl_rewards import config_lib

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


# ------------------------------------------------- commands quoted in docs --
#
# Every `python -m experiments.X --flag=...` quoted in README.md or docs/*.md
# must name a module that exists and flags it defines (read from its
# DEFINE_ calls, without importing or running it); every `--config.a.b=v`
# must name a key of the config the command loads; every `--override=a.b=v`
# (sweep, compare) a key of that config; and every `configs/X.py:arg` quoted
# must load with that argument.

DEFAULT_CONFIG = "configs/default.py"
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
_COMMAND = re.compile(r"python3? -m (experiments(?:\.\w+)+)")
# (Not one quoted inside an error message: 'configs/nope.py'.)
_CONFIG_ARG = re.compile(r"(?<![\w/.'])(configs/\w+\.py(?::[^\s`'\"),]*"
                         r"(?:,[^\s`'\")]+)*)?)")


def _doc_pages():
  return [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _code_texts(text):
  """The code of a markdown text: fenced blocks, indented blocks (4 spaces
  after a blank line) and inline spans, each as one string with line
  continuations joined."""
  blocks = [m.group(1) for m in _FENCE.finditer(text)]
  rest = _FENCE.sub("", text)
  indented, current = [], []
  previous_blank = True
  for line in rest.split("\n"):
    if line.startswith("    ") and (current or previous_blank):
      current.append(line[4:])
    elif current and not line.strip():
      current.append("")
    elif current:
      indented.append("\n".join(current))
      current = []
    previous_blank = not line.strip()
  if current:
    indented.append("\n".join(current))
  inline = [m.group(1).replace("\n", " ") for m in _INLINE.finditer(rest)]
  return [b.replace("\\\n", " ") for b in blocks + indented] + inline


def quoted_commands(text):
  """[(module, [arguments])] of every `python -m experiments.X` in `text`."""
  commands = []
  for code in _code_texts(text):
    for line in code.split("\n"):
      line = line.split(" #", 1)[0] if not line.lstrip().startswith(
          "#") else ""
      for match in _COMMAND.finditer(line):
        tail = re.split(r"&&|\|\||;|\|", line[match.end():])[0]
        try:
          words = shlex.split(tail)
        except ValueError:  # An unbalanced quote: keep the plain words.
          words = tail.split()
        commands.append((match.group(1), words))
  return commands


def quoted_config_args(text):
  """Every `configs/X.py[:arg]` quoted in code of `text`."""
  found = set()
  for code in _code_texts(text):
    found.update(m.group(1) for m in _CONFIG_ARG.finditer(code))
  return found


def _module_path(module):
  parts = module.split(".")
  for candidate in (os.path.join(ROOT, *parts) + ".py",
                    os.path.join(ROOT, *parts, "__init__.py")):
    if os.path.isfile(candidate):
      return candidate
  return None


@functools.lru_cache(maxsize=None)
def module_flags(module):
  """(flags, boolean flags, loads a config file, default config) of a module.

  Read from its source: `*.DEFINE_*("name", ...)` calls (and those of the
  `experiments` modules it imports), `cli.run(...)` (the locked `--config`
  file with overrides, and `--debug`), and, for a module that reads its own
  argv, the `"--name"` strings it compares against.
  """
  path = _module_path(module)
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  names, booleans = set(), set()
  config_file, default_config, dash_strings = False, None, set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      name = (func.attr if isinstance(func, ast.Attribute) else
              func.id if isinstance(func, ast.Name) else "")
      if name.startswith("DEFINE") and node.args and isinstance(
          node.args[0], ast.Constant):
        names.add(node.args[0].value)
        if name in ("DEFINE_bool", "DEFINE_boolean"):
          booleans.add(node.args[0].value)
      if (name == "run" and isinstance(func, ast.Attribute) and
          isinstance(func.value, ast.Name) and func.value.id == "cli"):
        config_file = True
        default_config = DEFAULT_CONFIG
        for keyword in node.keywords:
          if keyword.arg == "default_config":
            default_config = keyword.value.value
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and
          re.fullmatch(r"--\w+=?", node.value)):
      dash_strings.add(node.value.strip("-="))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                  else [f"{node.module}.{a.name}" for a in node.names])
      for other in imported:
        if other.startswith("experiments.") and other != module and \
            _module_path(other):
          more, more_bool, _, _ = module_flags(other)
          names |= more
          booleans |= more_bool
  if config_file:
    names |= {"config", "debug"}
    booleans.add("debug")
  if not names:
    names = dash_strings
  return frozenset(names), frozenset(booleans), config_file, default_config


@functools.lru_cache(maxsize=None)
def load_config(spec):
  return cli.load_config_file(os.path.join(ROOT, spec))


def _check_key(config, key, what):
  try:
    cli.check_override_key(config, key)
  except config_lib.ConfigError as e:
    return [f"{what}: {e}"]
  return []


def command_problems(module, words):
  """What is wrong with `python -m module words...` ([] if nothing)."""
  where = f"python -m {module} {' '.join(words)}"
  if _module_path(module) is None:
    return [f"{where}: no module {module}"]
  names, booleans, config_file, default_config = module_flags(module)
  problems, spec = [], default_config
  options = [w for w in words if w.startswith("--")]
  for option in options:
    flag, _, value = option[2:].partition("=")
    if flag == "config":
      spec = value
  for option in options:
    flag, _, value = option[2:].partition("=")
    if flag.startswith("config.") and config_file:
      continue  # Checked against the loaded config below.
    known = flag in names or (flag.startswith("no") and flag[2:] in booleans)
    if not known:
      problems.append(f"{where}: {module} defines no flag --{flag}")
  config = None
  if spec and ("config" in names or config_file):
    try:
      config = load_config(spec)
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"{where}: --config={spec} does not load: {e!r}")
  elif any(o.startswith(("--override=", "--config.")) for o in options):
    config = load_config(DEFAULT_CONFIG)
  if config is not None:
    for option in options:
      flag, _, value = option[2:].partition("=")
      if flag.startswith("config.") and config_file:
        problems += _check_key(config, flag[len("config."):], where)
      elif flag == "override":
        problems += _check_key(config, value.split("=", 1)[0], where)
  return problems


def test_every_quoted_command_parses():
  problems, count = [], 0
  for page in _doc_pages():
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for module, words in quoted_commands(text):
      count += 1
      problems += [f"{os.path.relpath(page, ROOT)}: {p}"
                   for p in command_problems(module, words)]
  assert count >= 50, count
  assert not problems, "\n".join(problems)


def test_every_quoted_config_loads():
  problems, specs = [], set()
  for page in _doc_pages():
    with open(page, encoding="utf-8") as f:
      specs |= quoted_config_args(f.read())
  assert len(specs) >= 20, specs
  for spec in sorted(specs):
    try:
      load_config(spec)
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"{spec}: {e!r}")
  assert not problems, "\n".join(problems)


BROKEN = """
```bash
python -m experiments.trian --workdir=runs/x
python -m experiments.train --wrokdir=runs/x
python -m experiments.train --config=configs/pav.py --config.rl.pav.alpah=1.0
python -m experiments.train --config=configs/nope.py
python -m experiments.sweep --config=configs/pav.py \\
    --workdir=runs/s --override=rl.grop_size=4
```

Inline: `python -m experiments.compare --regime=standard --seed=3`.
"""


def test_a_broken_command_is_caught():
  commands = quoted_commands(BROKEN)
  assert [m for m, _ in commands] == [
      "experiments.trian", "experiments.train", "experiments.train",
      "experiments.train", "experiments.sweep", "experiments.compare"]
  problems = [command_problems(m, w) for m, w in commands]
  assert "no module experiments.trian" in problems[0][0]
  assert "defines no flag --wrokdir" in problems[1][0]
  assert "alpah" in problems[2][0]
  assert "does not load" in problems[3][0]
  assert "grop_size" in problems[4][0]
  assert "defines no flag --seed" in problems[5][0]
  assert command_problems("experiments.train", [
      "--config=configs/pav.py:alpha=1.0", "--config.rl.pav.alpha=2",
      "--workdir=runs/x", "--debug", "--nodebug"]) == []


def test_a_broken_config_argument_is_caught():
  assert quoted_config_args("`--config=configs/pure.py:credit=min`") == {
      "configs/pure.py:credit=min"}
  with pytest.raises(Exception):
    load_config("configs/pure.py:credti=min")


def _anchors(text):
  """GitHub's anchors of the headings of a markdown text."""
  text = _FENCE.sub("", text)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
          for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_points_to_a_file_and_heading():
  problems = []
  for page in _doc_pages():
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for link, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text):
      if re.match(r"\w+://", link):
        continue
      target = os.path.normpath(os.path.join(os.path.dirname(page), link))
      name = os.path.relpath(page, ROOT)
      if not os.path.exists(target):
        problems.append(f"{name}: no such file {link}")
      elif anchor and target.endswith(".md"):
        with open(target, encoding="utf-8") as f:
          if anchor not in _anchors(f.read()):
            problems.append(f"{name}: {link} has no heading #{anchor}")
  assert not problems, "\n".join(problems)


def test_a_broken_link_is_caught():
  assert "prm-evaluation" in _anchors("# Title\n\n## PRM evaluation\n")
  assert "sampler-against-transformers-generate" in _anchors(
      "## Sampler against transformers `generate`\n")


SETUP = """\
# The default job: SFT -> Monte-Carlo labels -> PAV verifier -> RL (CPU, < 10 min).
python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m experiments.train

# The tests (CPU, < 10 min on 2 cores).
python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test,hf]' && pytest
"""


def test_the_readme_opens_with_the_set_up_commands_and_stays_short():
  # The first code block is the two commands newcomers and CI run; the rest
  # of the documentation lives in docs/.
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert _FENCE.search(text).group(1) == SETUP
  assert len(text.split("\n")) <= 350
