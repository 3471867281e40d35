"""Benchmark results as JSON files, and the documentation tables made from them.

Every benchmark's `--out=docs/results/NAME.json` writes its results with a
`provenance` record: the git revision (and whether the working tree had
changes), the date, the machine (CPU model, cores, Python and JAX versions)
and the load average when it started and ended, since these machines are
shared and ratios move with the load.

The benchmark tables of docs/ are not typed in: each is `render(NAME, data)`
of the committed `docs/results/NAME.json`, and lives in the page
`TARGETS[NAME]` (`tests/docs_numbers_test.py` checks that the page holds
every one verbatim). After re-running a benchmark, print its table with

    python -m experiments.benchmarks.results docs/results/sampler.json

or replace the old one in its page with `--update` (`--target=PATH` writes
into another file).
"""

import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(ROOT, "docs", "results")


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


# ------------------------------------------------------- the docs tables --


def _num(x, digits=0) -> str:
  return f"{x:,.{digits}f}"


def _ratio(x, digits=1) -> str:
  return f"{x:.{digits}f}×"


def caption(data: dict) -> str:
  """One line saying where and when the numbers were measured."""
  p = data["provenance"]
  if "transcribed_from" in p:
    return (f"*Numbers as published in README.md up to revision "
            f"{p['transcribed_from'][:7]}, transcribed into "
            f"docs/results/ on {p['date']}: that run's own output was not "
            f"kept. {p.get('note', '')}*".replace(" *", "*"))
  m = p["machine"]
  versions = ", ".join(f"{k} {m[k]}" for k in ("python", "jax", "torch",
                                               "transformers") if k in m)
  if "gpu" in m:
    return (f"*Measured {p['date'][:10]} on one {m['gpu']} ({m['cpu']}, "
            f"{m['cores']} cores; {versions}). {p.get('note', '')}*"
            ).replace(" *", "*")
  changes = " with uncommitted changes" if p["uncommitted_changes"] else ""
  load = (f"load average {p['load_average_start'][0]:.1f} at the start, "
          f"{p['load_average_end'][0]:.1f} at the end")
  return (f"*Measured {p['date'][:10]} at revision {p['revision'][:7]}"
          f"{changes} on {m['cpu']} ({m['cores']} cores; {versions}), "
          f"{load}.*")


def train_step_table(data: dict) -> str:
  with_floor = all("floor_tok_s" in r for r in data["rows"])
  lines = ["| step | B × T | ours tokens/s | torch tokens/s | ratio |",
           "|---|---|---|---|---|"]
  if with_floor:
    lines = [lines[0] + " dense floor tokens/s | ours ÷ floor time | "
             "torch ÷ floor time |", "|---|---|---|---|---|---|---|---|"]
  for r in data["rows"]:
    line = (f"| {r['step']} | {r['batch']} × {r['seq_len']} | "
            f"{_num(r['ours_tok_s'])} | {_num(r['torch_tok_s'])} | "
            f"{_ratio(r['ratio'], 2)} |")
    if with_floor:
      line += (f" {_num(r['floor_tok_s'])} | {r['ours_over_floor']:.2f} | "
               f"{r['torch_over_floor']:.2f} |")
    lines.append(line)
  return "\n".join(lines)


# The kinds of work of `step_profile`, in table order.
PROFILE_KINDS = ("dense matmuls", "attention", "copies", "optimizer", "other")


def step_profile_table(data: dict) -> str:
  """One line per configuration and side: ms in total and by kind."""
  lines = ["| configuration | side | ms | " + " | ".join(PROFILE_KINDS) + " |",
           "|---|---|---|" + "---|" * len(PROFILE_KINDS)]
  for r in data["rows"]:
    unit = " (per decoding step)" if r["step"] == "decode" else ""
    shape = f"{r['model']} {r['step']}, {r['batch']} × {r['length']}{unit}"
    for side, label in (("ours", "ours"), ("torch", "PyTorch")):
      kinds = r[f"{side}_kinds_ms"]
      lines.append(f"| {shape} | {label} | {r[side + '_ms']:,.1f} | " +
                   " | ".join(f"{kinds[k]:,.1f}" for k in PROFILE_KINDS) +
                   " |")
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


def episodes_table(data: dict) -> str:
  lines = ["| model | batch | prompt + G | turns per episode | decode steps: "
           "episodes / single-turn | single-turn sampler (tokens/s) | "
           "episodes (tokens/s) | episodes: policy tokens/s | episodes ÷ "
           "single-turn |", "|---|---|---|---|---|---|---|---|---|"]
  for r in data["rows"]:
    lines.append(
        f"| {r['size']} ({r['params'] / 1e6:.1f} M) | {r['batch']} | "
        f"{r['prompt_len']} + {r['episode_tokens']} | {r['mean_turns']:.1f} "
        f"| {r['episode_decode_steps']} / {r['episode_tokens']} "
        f"| {_num(r['single_tokens_per_s'])} | "
        f"{_num(r['episode_tokens_per_s'])} | "
        f"{_num(r['policy_tokens_per_s'])} | {_ratio(r['ratio'], 2)} |")
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


SEARCH_MODES = {
    "prm": "beam search on its step scores",
    "pav": "beam search on Q + α·A^μ (PAV)",
    "oracle_prm": "beam search, oracle PRM (the step checker)",
    "oracle_pav": "beam search, oracle PAV (the step checker as prover)",
}


def search_efficiency(point, reference):
  """Best-of-N tokens reaching `point`'s accuracy, over the tokens beam
  search spent; None where Best-of-N never reaches it or its accuracy does
  not grow with N (`reports.tokens_to_match`)."""
  from rl_rewards import reports  # pylint: disable=g-import-not-at-top
  match = reports.tokens_to_match(reference, point["accuracy"])
  return None if match is None else match / point["tokens_per_problem"]


def search_table(data: dict) -> str:
  """Beam search by width B, each verifier's modes: accuracy (tokens per
  problem), then its compute efficiency against Best-of-N with the same
  verifier (oracle modes against oracle Best-of-N)."""
  beams = data["beam_widths"]
  lines = ["| verifier | search | " + " | ".join(f"B={b}" for b in beams) +
           " |", "|---|---|" + "---|" * len(beams)]
  for run in data["runs"]:
    curves = run["curves"]
    for mode, label in SEARCH_MODES.items():
      if mode not in curves:
        continue
      points = {p["budget"]: p for p in curves[mode]}
      reference = curves.get("oracle_best_of_n" if mode.startswith("oracle_")
                             else "best_of_n", [])
      cells, ratios = [], []
      for b in beams:
        p = points.get(b)
        cells.append("–" if p is None else
                     f"{p['accuracy']:.2f} ({p['tokens_per_problem']:.0f})")
        ratio = None if p is None else search_efficiency(p, reference)
        ratios.append("–" if ratio is None else _ratio(ratio, 2))
      lines.append(f"| {run['name']} | {label}: accuracy (tokens) | " +
                   " | ".join(cells) + " |")
      lines.append(f"| {run['name']} | {label}: efficiency vs Best-of-N | " +
                   " | ".join(ratios) + " |")
  return "\n".join(lines)


def best_of_n_table(data: dict) -> str:
  """Best-of-N accuracy (tokens per problem) by N, for each verifier."""
  budgets = sorted({p["budget"] for run in data["runs"]
                    for name, curve in run["curves"].items()
                    if name.endswith("best_of_n") for p in curve})
  lines = ["| verifier | Best-of-N | " + " | ".join(f"N={n}" for n in budgets)
           + " |", "|---|---|" + "---|" * len(budgets)]
  for run in data["runs"]:
    aggregation = data.get("settings", {}).get("aggregation", "min")
    for name, label in (("best_of_n", f"its scores ({aggregation})"),
                        ("oracle_best_of_n", "the step checker")):
      if name not in run["curves"]:
        continue
      points = {p["budget"]: p for p in run["curves"][name]}
      cells = ["–" if n not in points else
               f"{points[n]['accuracy']:.2f} "
               f"({points[n]['tokens_per_problem']:.0f})" for n in budgets]
      lines.append(f"| {run['name']} | {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def add_search_run(path: str, name: str, curves: dict, settings: dict,
                   start: dict):
  """Adds (or replaces) verifier `name`'s search curves in the results
  file `path`, with this run's provenance; the file's provenance is the
  latest run's, and the runs must share their settings."""
  data = {"runs": []}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if data.get("settings", settings) != settings:
      raise ValueError(f"{path} holds search runs with other settings "
                       f"({data['settings']}); write to another file.")
  run = {"name": name, "curves": curves, "provenance": provenance(start)}
  runs = [r for r in data.get("runs", []) if r["name"] != name] + [run]
  beams = sorted({p["budget"] for r in runs for mode in SEARCH_MODES
                  for p in r["curves"].get(mode, [])})
  write(path, {"settings": settings, "beam_widths": beams, "runs": runs},
        start)


def _section(data: dict, name: str) -> dict:
  return data["sections"].get(name, {}).get("results", {})


def _sample_rows(data: dict) -> list:
  """The sampler rows of the run and of a later `sample` call, by batch
  (the run's first), each with its MBU over the probe's copy rate."""
  copy = _section(data, "probe")["copy_gb_s"]
  rows = {}
  later = data.get("later_calls", {}).get("sample", {}).get("results", {})
  for source in (later.get("rows", []), _section(data, "sample").get("rows",
                                                                     [])):
    for r in source:
      rows[r["batch"]] = dict(r, mbu=r["achieved_gb_s"] / copy)
  return [rows[b] for b in sorted(rows)]


def accelerator_correctness_table(data: dict) -> str:
  """The accelerator's forward and decoding against the CPU's float32."""
  c = _section(data, "correctness")
  lines = ["| check (Qwen2.5-0.5B shapes, random weights) | result | "
           "tolerance |", "|---|---|---|"]
  lines.append(f"| attention that ran (compiled HLO) | "
               f"{c['attention_implementation']} "
               f"(`{', '.join(c['attention_custom_calls'])}`) | – |")
  for key, label, tol in (
      ("logits_rel_err_f32", "logits ‖Δ‖/‖ref‖, float32 (`highest`)",
       "tolerance_f32"),
      ("logits_rel_err_bf16", "logits ‖Δ‖/‖ref‖, bfloat16 activations",
       "tolerance_bf16"),
      ("logits_rel_err_bf16_weights", "logits ‖Δ‖/‖ref‖, bfloat16 weights "
       "too (the sampler's copy)", "tolerance_bf16")):
    lines.append(f"| {label} | {c[key]:.1e} | {c[tol]:.0e} |")
  lines.append(f"| argmax equal to the CPU's, bfloat16 | "
               f"{c['argmax_agreement_bf16']:.1%} | – |")
  greedy = ("not measured (the section's time cap)"
            if "greedy_f32_identical" not in c else
            "identical" if c["greedy_f32_identical"] else "DIFFERENT")
  lines.append(f"| greedy decoding, float32, against the CPU's | {greedy} | "
               f"identical |")
  for row in _section(data, "train").get("rows", []):
    lines.append(f"| {row['step']} step losses finite (8 steps) | "
                 f"{'yes' if row['losses_finite'] else 'NO'} | – |")
  return "\n".join(lines)


def accelerator_train_table(data: dict) -> str:
  """Training steps: tokens/s and MFU, ours and transformers/torch."""
  t = _section(data, "train")
  torch_rows = {r["step"]: r for r in _section(data, "train_torch").get(
      "rows", [])}
  lines = ["| step | B × T | remat | ours tokens/s | MFU causal | MFU "
           "non-causal | MFU causal, datasheet peak | torch tokens/s | "
           "ours ÷ torch |", "|---|---|---|---|---|---|---|---|---|"]
  for r in t["rows"]:
    theirs = torch_rows.get(r["step"], {})
    ratio = theirs.get(f"ours_over_torch_remat_{r['remat']}")
    lines.append(
        f"| {r['step']} | {t['batch']} × {t['seq_len']} | {r['remat']} | "
        f"{_num(r['tokens_per_s'])} | {r['mfu_causal']:.1%} | "
        f"{r['mfu_noncausal']:.1%} | {r['mfu_causal_datasheet']:.1%} | "
        f"{_num(theirs['tokens_per_s']) if theirs else '–'} | "
        f"{_ratio(ratio, 2) if ratio else '–'} |")
  return "\n".join(lines)


def accelerator_sample_table(data: dict) -> str:
  """Decoding: tokens/s and MBU, ours and transformers `generate`."""
  hf = {r["batch"]: r for r in _section(data, "sample_hf").get("rows", [])}
  lines = ["| batch | new tokens | ours tokens/s | bytes read (weights + "
           "KV) | achieved GB/s | MBU | transformers tokens/s | ratio |",
           "|---|---|---|---|---|---|---|---|"]
  new_tokens = _section(data, "sample")["new_tokens"]
  for r in _sample_rows(data):
    theirs = hf.get(r["batch"])
    lines.append(
        f"| {r['batch']} | {new_tokens} | {_num(r['tokens_per_s'])} | "
        f"{r['total_bytes'] / 1e12:.2f} TB | {_num(r['achieved_gb_s'])} | "
        f"{r['mbu']:.1%} | "
        f"{_num(theirs['tokens_per_s']) if theirs else 'not measured'} | "
        f"{_ratio(r['tokens_per_s'] / theirs['tokens_per_s'], 0) if theirs else '–'} |")
  return "\n".join(lines)


def accelerator_profile_table(data: dict) -> str:
  """Kernel time by kind of one profiled call of each program."""
  kinds = ("matmul", "attention", "elementwise/fusion", "copy", "reduction")
  lines = ["| program | wall ms | kernel ms | " + " | ".join(kinds) + " |",
           "|---|---|---|" + "---|" * len(kinds)]
  programs = [("SFT step 8 × 2048", _section(data, "train").get(
      "profile_sft"))]
  later = data.get("later_calls", {}).get("sample", {}).get("results", {})
  for batch in (64, 256):
    programs.append((f"sampler, batch {batch} × 512 new",
                     _section(data, "sample").get(f"profile_batch_{batch}")
                     or later.get(f"profile_batch_{batch}")))
  for label, p in programs:
    if p and "kinds_ms" in p:
      lines.append(f"| {label} | {p['wall_ms']:,.0f} | {p['kernel_ms']:,.0f} "
                   "| " + " | ".join(f"{p['kinds_ms'].get(k, 0):,.0f}"
                                     for k in kinds) + " |")
  return "\n".join(lines)


def accelerator_rl_table(data: dict) -> str:
  """One `configs/qwen_gsm8k.py` RL step at 1.5B, by phase."""
  rl = _section(data, "rl_step")
  phases = ("rollout", "reward", "reference", "advantages", "update")
  lines = ["| phase | step 1 s (compiles) | step 2 s | GPU busy, step 2 |",
           "|---|---|---|---|"]
  one, two = rl["step_1"], rl["step_2"]
  for name in phases:
    busy = two.get(f"gpu_busy_{name}")
    lines.append(f"| {name} | {one[name]:.2f} | {two[name]:.2f} | "
                 f"{'–' if busy is None else f'{busy:.1%}'} |")
  lines.append(f"| whole step | {one['step_s']:.2f} | {two['step_s']:.2f} | "
               f"{two['gpu_busy']:.1%} |")
  job = data.get("later_calls", {}).get("default_job", {})
  cpu = _section(data, "default_job").get("cpu_wall_s")
  lines += ["", "| default job (`python -m experiments.train`) | wall s |",
            "|---|---|"]
  if job:
    lines.append(f"| {data['provenance']['machine'].get('gpu', 'GPU')} | "
                 f"{job['wall_s']:.0f} |")
  if cpu:
    lines.append(f"| 2-core CPU (docs/performance.md) | {cpu:.0f} |")
  return "\n".join(lines)


def _top_kernels(profile: dict, count: int = 3) -> str:
  return ", ".join(f"`{k['name'][:28]}` {k['ms']:,.0f}"
                   for k in profile["top_kernels"][:count])


def accelerator_second_run_table(data: dict) -> str:
  """The second run: greedy decoding against the CPU, and the sampler with
  XLA's Triton GEMM fusions on and off, beside `generate`, in one run."""
  run = data["second_run"]
  c = _section(run, "correctness")
  lines = ["| second run | result |", "|---|---|",
           f"| greedy decoding, float32, {c['greedy_new_tokens']} new tokens "
           f"× 2 rows, against the CPU's | "
           f"{'identical' if c['greedy_f32_identical'] else 'DIFFERENT'} |",
           f"| greedy decoding, bfloat16, tokens equal to the CPU's float32 "
           f"| {c['greedy_bf16_agreement']:.1%} (first divergence at token "
           f"{c['greedy_bf16_first_divergence']}) |",
           f"| logits ‖Δ‖/‖ref‖, bfloat16 activations | "
           f"{c['logits_rel_err_bf16']:.1e} |"]
  copy = _section(run, "probe")["copy_gb_s"]
  lines += ["", "| sampler, batch 64 × 512 new (second run) | tokens/s | MBU "
            "| kernel ms | kernels | largest kernels, ms |",
            "|---|---|---|---|---|---|"]
  for name, label in (("sample", "Triton GEMM fusions on (XLA's default)"),
                      ("sample_cublas", "Triton GEMM fusions off (cuBLAS)")):
    section = _section(run, name)
    row, profile = section["rows"][0], section["profile_batch_64"]
    lines.append(f"| {label} | {_num(row['tokens_per_s'])} | "
                 f"{row['achieved_gb_s'] / copy:.1%} | "
                 f"{profile['kernel_ms']:,.0f} | {profile['kernels']:,} | "
                 f"{_top_kernels(profile)} |")
  hf = _section(run, "sample_hf")["rows"][0]
  ours = _section(run, "sample")["rows"][0]["tokens_per_s"]
  lines.append(f"| transformers `generate` | {_num(hf['tokens_per_s'])} "
               f"(ours {_ratio(ours / hf['tokens_per_s'], 0)}) | – | – | – "
               f"| – |")
  return "\n".join(lines)


def micro_batches_table(data: dict) -> str:
  """The default job's programs by micro-batch size (0: the whole batch)."""
  lines = ["| program | B × T | micro-batch rows | ms | speed-up | loss or "
           "log-prob rel. difference |", "|---|---|---|---|---|---|"]
  for r in data["rows"]:
    rows, slots = data["shapes"][r["program"]]
    size = r["micro_batch_size"] or "whole batch"
    lines.append(f"| {r['program']} | {rows} × {slots} | {size} | "
                 f"{r['median_ms']:,.1f} | {_ratio(r['speedup'], 2)} | "
                 f"{r['relative_difference']:.1e} |")
  return "\n".join(lines)


# name -> renderers of its tables, in page order. Each block of the page is
# a table; the last is followed by a blank line and the caption.
TABLES = {
    "train_step": (train_step_table,),
    "step_profile": (step_profile_table,),
    "micro_batches": (micro_batches_table,),
    "advantages": (advantages_table,),
    "sampler": (sampler_table,),
    "episodes": (episodes_table,),
    "hostile": (hostile_table,),
    "faults": (faults_table, faults_stage_table),
    "search": (search_table, best_of_n_table),
    "accelerator": (accelerator_correctness_table, accelerator_train_table,
                    accelerator_sample_table, accelerator_profile_table,
                    accelerator_rl_table, accelerator_second_run_table),
}


# name -> the page (relative to the repository root) that holds its tables.
TARGETS = {
    "train_step": "docs/performance.md",
    "step_profile": "docs/performance.md",
    "micro_batches": "docs/performance.md",
    "advantages": "docs/performance.md",
    "sampler": "docs/performance.md",
    "episodes": "docs/performance.md",
    "hostile": "docs/reliability.md",
    "faults": "docs/reliability.md",
    "search": "docs/prm_evaluation.md",
    "accelerator": "docs/accelerator.md",
}


def target_path(name: str) -> str:
  """The absolute path of the page that holds the tables of `name`."""
  return os.path.join(ROOT, TARGETS[name])


def load(name: str) -> dict:
  with open(os.path.join(RESULTS_DIR, f"{name}.json"), encoding="utf-8") as f:
    return json.load(f)


def render(name: str, data: dict | None = None) -> list[str]:
  """The blocks of `docs/results/<name>.json` in its page: each table, and
  the caption after the last."""
  data = load(name) if data is None else data
  blocks = [table(data) for table in TABLES[name]]
  blocks[-1] += "\n\n" + caption(data)
  return blocks


CAPTION_STARTS = ("*Measured ", "*Numbers as published ")


def update_doc(text: str, name: str, data: dict | None = None) -> str:
  """`text` (a page's markdown) with the tables of `name` replaced by
  `render`'s.

  Each table is found by its header line (the first table of the page with
  that header, after the previous one of `name`); the caption line after
  the last table is replaced or, if there is none, inserted. A page without
  the header raises ValueError.
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


update_readme = update_doc  # Its former name, from when the tables were there.


def main(argv):
  """Prints the blocks of each results file named in `argv`; with
  `--update`, writes them into the file's page (`TARGETS`) or into
  `--target=PATH` instead. `--update_readme` is the former name of
  `--update`."""
  update = "--update" in argv or "--update_readme" in argv
  targets = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--target=")]
  unknown = [a for a in argv[1:] if a.startswith("--") and a not in (
      "--update", "--update_readme") and not a.startswith("--target=")]
  if unknown:
    raise SystemExit(f"unknown flags {unknown}; use --update, --target=PATH")
  for path in (a for a in argv[1:] if not a.startswith("--")):
    name = os.path.splitext(os.path.basename(path))[0]
    if name not in TABLES:
      raise SystemExit(f"{path}: no tables for {name!r}; known: "
                       f"{', '.join(sorted(TABLES))}")
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if update:
      page = targets[-1] if targets else target_path(name)
      with open(page, encoding="utf-8") as f:
        try:
          text = update_doc(f.read(), name, data)
        except ValueError:
          raise SystemExit(f"{page}: no table headed like {name}'s; add "
                           f"its rendering there once") from None
      with open(page, "w", encoding="utf-8") as f:
        f.write(text)
      print(f"{name}: tables written into {page}")
    else:
      print("\n\n".join(render(name, data)) + "\n")


if __name__ == "__main__":
  main(sys.argv)
