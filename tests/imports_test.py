"""The modules of `rl_rewards` import each other without a cycle.

The import graph is read from the source (`ast`), every import counted,
including those inside functions: a deferred import hides a cycle from the
interpreter, not from a reader. An edge goes from a module to the module it
names: `from rl_rewards.a import b` names `rl_rewards.a.b` when that is a
module, else `rl_rewards.a`.
"""

import ast
import pathlib

import rl_rewards

_ROOT = pathlib.Path(rl_rewards.__file__).parent


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules(root: pathlib.Path) -> dict:
  """{module name: path} of every module under `root`."""
  return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
  """The `rl_rewards` modules that module `name` imports."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                 else base for alias in node.names]
    else:
      continue
    out.update(t for t in targets if t in modules and t != name)
  return out


def import_graph(root: pathlib.Path = _ROOT) -> dict:
  modules = _modules(root)
  return {name: _imports(name, path, modules)
          for name, path in modules.items()}


def find_cycle(graph: dict):
  """One import cycle as a list of modules (first == last), or None."""
  state = {}  # 1: on the current path, 2: finished.
  path = []

  def visit(node):
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = visit(nxt)
        if cycle:
          return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def test_graph_sees_the_package():
  graph = import_graph()
  assert "rl_rewards.runners.rl" in graph
  assert "rl_rewards.core" in graph["rl_rewards.runners.rl"]


def test_find_cycle_on_a_hand_made_graph():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [
      "a", "b", "c", "a"]


def test_find_cycle_sees_deferred_and_relative_imports(tmp_path):
  pkg = tmp_path / "rl_rewards"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from rl_rewards.sub import b\n")
  (pkg / "sub" / "b.py").write_text(
      "def f():\n  from .. import a\n  return a\n")
  graph = import_graph(pkg)
  assert graph["rl_rewards.a"] == {"rl_rewards.sub.b"}
  assert graph["rl_rewards.sub.b"] == {"rl_rewards.a"}
  assert find_cycle(graph) is not None


def test_no_import_cycles():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)
