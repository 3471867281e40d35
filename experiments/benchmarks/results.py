"""Benchmark results as JSON files, and the README tables made from them.

Every benchmark's `--out=docs/results/NAME.json` writes its results with a
`provenance` record: the git revision (and whether the working tree had
changes), the date, the machine (CPU model, cores, Python and JAX versions)
and the load average when it started and ended, since these machines are
shared and ratios move with the load.

The README's benchmark tables are not typed in: each is `render(NAME, data)`
of the committed `docs/results/NAME.json`, and `tests/docs_numbers_test.py`
checks that README.md holds every one verbatim. After re-running a
benchmark, print its table with

    python -m experiments.benchmarks.results docs/results/sampler.json

or replace the old one in README.md with `--update_readme`.
"""

import datetime
import json
import os
import platform
import subprocess
import sys

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "docs", "results")


def _git(*args) -> str:
  try:
    return subprocess.run(
        ["git", *args], cwd=os.path.dirname(os.path.abspath(__file__)),
        capture_output=True, text=True, check=True, timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _versions() -> dict:
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "torch", "transformers", "numpy"):
    module = sys.modules.get(name)
    if module is not None and hasattr(module, "__version__"):
      out[name] = module.__version__
  if "jax" not in out:
    import jax  # pylint: disable=g-import-not-at-top
    out["jax"] = jax.__version__
  return out


def started() -> dict:
  """What a benchmark records when it starts: the date and the load."""
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"), "load_average_start": list(os.getloadavg())}


def provenance(start: dict) -> dict:
  """The revision, machine and load of a run begun with `started()`."""
  return {
      "revision": _git("rev-parse", "HEAD"),
      "uncommitted_changes": bool(_git("status", "--porcelain",
                                       "--untracked-files=no")),
      "date": start["date"],
      "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                  "platform": platform.platform(), **_versions()},
      "load_average_start": start["load_average_start"],
      "load_average_end": list(os.getloadavg()),
      "command": " ".join(["python", "-m", _module_name()] + sys.argv[1:]),
  }


def _module_name() -> str:
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  return getattr(spec, "name", None) or os.path.basename(sys.argv[0])


def write(path: str, data: dict, start: dict):
  """Writes `data` with its `provenance` to `path` (JSON)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  data = dict(data, provenance=provenance(start))
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2)
    f.write("\n")


# ------------------------------------------------------ the README tables --


def _num(x, digits=0) -> str:
  return f"{x:,.{digits}f}"


def _ratio(x, digits=1) -> str:
  return f"{x:.{digits}f}×"


def caption(data: dict) -> str:
  """One line saying where and when the numbers were measured."""
  p = data["provenance"]
  if "transcribed_from" in p:
    return (f"*Numbers as published in this README up to revision "
            f"{p['transcribed_from'][:7]}, transcribed into "
            f"docs/results/ on {p['date']}: that run's own output was not "
            f"kept. {p.get('note', '')}*".replace(" *", "*"))
  m = p["machine"]
  versions = ", ".join(f"{k} {m[k]}" for k in ("python", "jax", "torch",
                                               "transformers") if k in m)
  changes = " with uncommitted changes" if p["uncommitted_changes"] else ""
  load = (f"load average {p['load_average_start'][0]:.1f} at the start, "
          f"{p['load_average_end'][0]:.1f} at the end")
  return (f"*Measured {p['date'][:10]} at revision {p['revision'][:7]}"
          f"{changes} on {m['cpu']} ({m['cores']} cores; {versions}), "
          f"{load}.*")


def train_step_table(data: dict) -> str:
  lines = ["| step | B × T | ours tokens/s | torch tokens/s | ratio |",
           "|---|---|---|---|---|"]
  for r in data["rows"]:
    lines.append(f"| {r['step']} | {r['batch']} × {r['seq_len']} | "
                 f"{_num(r['ours_tok_s'])} | {_num(r['torch_tok_s'])} | "
                 f"{_ratio(r['ratio'], 2)} |")
  return "\n".join(lines)


ESTIMATOR_NAMES = {
    "gae": "GAE (γ {gamma:g}, λ {lam:g})", "grpo": "GRPO outcome",
    "rloo": "RLOO outcome", "reinforce_plus_plus": "REINFORCE++",
    "min_form": "min-form (PURE) vs a Python loop over positions"}


def advantages_table(data: dict) -> str:
  lines = ["| estimator | verl (ms) | ours (ms) | speed-up | bandwidth bound "
           "(ms) | max abs diff |", "|---|---:|---:|---:|---:|---:|"]
  for r in data["rows"]:
    name = ESTIMATOR_NAMES.get(r["estimator"], r["estimator"]).format(
        gamma=data["gamma"], lam=data["lam"])
    diff = r.get("max_abs_diff")
    diff = "–" if diff is None else ("0" if diff == 0 else
                                     f"{diff:.1e}".replace("e-0", "e-"))
    verl = f"{r['verl_ms']:.1f}" if "verl_ms" in r else "–"
    speedup = f"{r['speedup']:.0f}×" if "speedup" in r else "–"
    lines.append(f"| {name} | {verl} | {r['ours_ms']:.2f} | {speedup} | "
                 f"{r['bound_ms']:.2f} | {diff} |")
  return "\n".join(lines)


def sampler_table(data: dict) -> str:
  lines = ["| model | batch | new tokens | mode | ours (tokens/s) | "
           "transformers (tokens/s) | ratio | dense floor (tokens/s) | "
           "ours ÷ floor time |", "|---|---|---|---|---|---|---|---|---|"]
  for r in data["rows"]:
    lines.append(
        f"| {r['size']} ({r['params'] / 1e6:.1f} M) | {r['batch']} | "
        f"{r['new_tokens']} | {r['mode']} | {_num(r['ours_tok_s'])} | "
        f"{_num(r['hf_tok_s'])} | {_ratio(r['ratio'])} | "
        f"{_num(r['floor_tok_s'])} | {r['ours_over_floor']:.2f} |")
  return "\n".join(lines)


VERIFIER_NAMES = {"exact": "exact", "gsm8k": "GSM8K", "math": "math-verify",
                  "reasoning_gym": "reasoning-gym",
                  "step_checker": "step checker"}


# Verifiers that read inputs of any size (linear time): no oversize count.
UNLIMITED_SIZE = ("step_checker",)


def hostile_table(data: dict) -> str:
  lines = ["| verifier | ok | oversize | timeout | crash | wrong type | "
           "max call (s) | hostile: verifications/s | ordinary: "
           "verifications/s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  ordinary = data.get("ordinary", {})
  for name, r in data["results"].items():
    c = r["counts"]
    oversize = "—" if name in UNLIMITED_SIZE else str(c["oversize"])
    call = f"{r['max_call_s']:.3f}" if r["max_call_s"] < 1 else (
        f"{r['max_call_s']:.2f}")
    rate = (_num(ordinary[name]["verifications_per_s"]) if name in ordinary
            else "–")
    lines.append(
        f"| {VERIFIER_NAMES.get(name, name)} | {c['ok']} | {oversize} | "
        f"{c['timeout']} | {c['crash'] + c.get('error', 0)} | "
        f"{c['wrong_type']} | {call} | {_num(r['verifications_per_s'])} | "
        f"{rate} |")
  return "\n".join(lines)


def faults_table(data: dict) -> str:
  lines = ["| run | kills | trials | resumed exactly |", "|---|---|---|---|"]
  for r in data["runs"]:
    lines.append(f"| {r['run']} | {r['kills']} | {r['trials']} | "
                 f"{r['exact_trials']}/{r['trials']} trials "
                 f"({r['exact_kills']}/{r['kills']} kills) |")
  return "\n".join(lines)


def faults_stage_table(data: dict) -> str:
  lines = ["| stage at the kill | kills | left a partial checkpoint | left a "
           "partial label shard | left a torn metrics line | trials exact |",
           "|---|---|---|---|---|---|"]
  for r in data["by_stage"]:
    lines.append(f"| {r['stage']} | {r['kills']} | {r['partial_checkpoint']} "
                 f"| {r['partial_shard']} | {r['torn_metrics']} | "
                 f"{r['exact_trials']}/{r['trials']} |")
  return "\n".join(lines)


def search_table(data: dict) -> str:
  beams = data["beam_widths"]
  lines = ["| search | " + " | ".join(f"B={b}" for b in beams) + " |",
           "|---|" + "---|" * len(beams)]
  for r in data["rows"]:
    lines.append(f"| {r['search']} | " + " | ".join(r["cells"]) + " |")
  return "\n".join(lines)


# name -> renderers of its tables, in README order. Each README block is the
# tables joined by a blank line, then the caption.
TABLES = {
    "train_step": (train_step_table,),
    "advantages": (advantages_table,),
    "sampler": (sampler_table,),
    "hostile": (hostile_table,),
    "faults": (faults_table, faults_stage_table),
    "search": (search_table,),
}


def load(name: str) -> dict:
  with open(os.path.join(RESULTS_DIR, f"{name}.json"), encoding="utf-8") as f:
    return json.load(f)


def render(name: str, data: dict | None = None) -> list[str]:
  """The README blocks of `docs/results/<name>.json`: each table, and the
  caption after the last."""
  data = load(name) if data is None else data
  blocks = [table(data) for table in TABLES[name]]
  blocks[-1] += "\n\n" + caption(data)
  return blocks


CAPTION_STARTS = ("*Measured ", "*Numbers as published ")


def update_readme(text: str, name: str, data: dict | None = None) -> str:
  """`text` (README.md) with the tables of `name` replaced by `render`'s.

  Each table is found by its header line (the first README table with that
  header, after the previous one of `name`); the caption line after the
  last table is replaced or, if there is none, inserted.
  """
  lines = text.split("\n")
  at = 0
  for block in render(name, data):
    new = block.split("\n")
    header = new[0]
    start = lines.index(header, at)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
      end += 1
    table_end = new.index("") if "" in new else len(new)
    if table_end < len(new):  # The block ends with the caption.
      if (end + 1 < len(lines) and not lines[end] and
          lines[end + 1].startswith(CAPTION_STARTS)):
        end += 2
    lines[start:end] = new
    at = start + len(new)
  return "\n".join(lines)


def main(argv):
  """Prints the README blocks of each results file named in `argv`; with
  `--update_readme`, writes them into README.md instead."""
  update = "--update_readme" in argv
  readme = os.path.join(os.path.dirname(RESULTS_DIR), os.pardir, "README.md")
  for path in (a for a in argv[1:] if not a.startswith("--")):
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if update:
      with open(readme, encoding="utf-8") as f:
        text = update_readme(f.read(), name, data)
      with open(readme, "w", encoding="utf-8") as f:
        f.write(text)
    else:
      print("\n\n".join(render(name, data)) + "\n")


if __name__ == "__main__":
  main(sys.argv)
