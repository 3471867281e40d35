r"""Kill anywhere: SIGKILL the pipeline at random moments, resume, compare.

    python -m experiments.benchmarks.faults --kills=50 --out=runs/faults
    python -m experiments.benchmarks.faults --kills=20 --async_save \
        --out=runs/faults_async

Runs the whole pipeline (`--config`, by default the `test`-size default job:
sft -> labels -> prm -> rl) as a subprocess, `python -m experiments.train`.
First twice uninterrupted: the first run fills a JAX compilation cache that
every later run shares (so restarts cost seconds, not compiles) and the second
is the reference; the two must be identical, or the comparison would mean
nothing. Then trials until `--kills` kills: each trial starts a fresh workdir,
kills the run with SIGKILL, restarts it (sometimes killing it again, up to
`--max_kills_per_trial`) until it finishes, and compares the result with the
reference. A kill is either

* timed: a uniform fraction of the way into one stage (stages taken in
  turn, so every stage gets kills): the harness waits for the previous
  stage's done marker, then for that fraction of the stage's span in the
  reference run; on a restart, after a delay uniform over the run's span; or
* at a named point (`rl_rewards/kill_points.py`): the N-th checkpoint save
  (optionally a few hundred ms later, inside orbax's write), the moment after
  a save, inside the done marker's write, inside a label shard's write, half
  way through a metrics record, inside the summary's write — N drawn over the
  occurrences the reference run passed. (A multi-turn rollout also passes
  `episodes.turn`, between two turns of its episodes; the four-stage
  pipeline here never does: tests/runners/multiturn_resume_test.py kills a
  multi-turn run there.)

After each kill the workdir is inspected: the stage running (the first one not
marked done) and what the kill left half-written (an orbax temporary
directory, a label shard's temporary file, a torn metrics line). A trial is
exact when the final workdir equals the reference bit for bit: every stage's
latest checkpoint (parameters, optimizer state, counters), the label files,
every metrics.jsonl record in order, the stage done markers and summary.json,
ignoring only wall-clock keys (`time`, `time/*`, `perf/*`, seconds)
and the label set's path.
Writes `faults.json` (every kill and trial) and `faults.md` (the tables) to
`--out`; with `--results=docs/results/faults.json`, also the summary the
published tables are rendered from (`summary`: one row for the run, one per
stage killed in), with its provenance.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

from experiments.benchmarks import results as results_lib
from rl_rewards import checkpoints
from rl_rewards import kill_points
from rl_rewards import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STAGES = ("sft", "labels", "prm", "rl")
# Summary and record keys that may differ between identical runs: wall-clock
# times, and the label set's path (it names the workdir).
IGNORED_KEYS = ("time", "wall_time_s", "stage_time_s", "sft/compute_seconds",
                "prm/seconds", "rl/seconds", "sft_continue/seconds",
                "labels/path")


def ignored_key(key: str) -> bool:
  return key in IGNORED_KEYS or key.startswith(("time/", "perf/"))


def _strip(d: dict) -> dict:
  return {k: v for k, v in d.items() if not ignored_key(k)}


def comparable_summary(summary: dict) -> dict:
  out = _strip(summary)
  out["stages"] = {s: _strip(values)
                   for s, values in summary.get("stages", {}).items()}
  return out


def stage_states(workdir: str) -> dict:
  """{stage: (step, flat list of host arrays)} of every latest checkpoint."""
  out = {}
  root = os.path.join(workdir, "checkpoints")
  for stage in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    ckpt = checkpoints.Checkpointer(os.path.join(root, stage), cleanup=False)
    try:
      step = ckpt.latest_step()
      if step is not None:
        import jax  # pylint: disable=g-import-not-at-top
        out[stage] = (step, jax.tree.leaves(ckpt.restore_raw(step)))
    finally:
      ckpt.close()
  return out


def _done_markers(workdir: str) -> dict:
  out = {}
  for stage in STAGES + ("prm_eval", "sft_continue"):
    path = os.path.join(workdir, "checkpoints", stage, "stage_done.json")
    if os.path.exists(path):
      done = metrics_lib.read_json(path)
      out[stage] = (done["step"], comparable_summary(
          {"stages": {stage: done["summary"]}})["stages"][stage])
  return out


def _label_files(workdir: str) -> dict:
  path = os.path.join(workdir, "labels")
  if not os.path.isdir(path):
    return {}
  out = {}
  for name in sorted(os.listdir(path)):
    if ".tmp" not in name:
      with open(os.path.join(path, name), "rb") as f:
        out[name] = f.read()
  return out


def compare(reference: str, workdir: str) -> list:
  """Differences between two finished workdirs (empty: exact)."""
  diffs = []
  ref_summary = metrics_lib.read_json(os.path.join(reference, "summary.json"))
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return ["no summary.json"]
  if comparable_summary(metrics_lib.read_json(path)) != comparable_summary(
      ref_summary):
    diffs.append("summary.json differs")
  ref_records = [_strip(r) for r in metrics_lib.read_metrics(reference)]
  records = [_strip(r) for r in metrics_lib.read_metrics(workdir)]
  if records != ref_records:
    first = next((i for i, (a, b) in enumerate(zip(records, ref_records))
                  if a != b), min(len(records), len(ref_records)))
    diffs.append(f"metrics.jsonl differs: {len(records)} records vs "
                 f"{len(ref_records)}, first difference at record {first}")
  if _done_markers(workdir) != _done_markers(reference):
    diffs.append("stage done markers differ")
  ref_labels, labels = _label_files(reference), _label_files(workdir)
  if labels != ref_labels:
    diffs.append("label files differ: " + ", ".join(sorted(
        n for n in set(labels) | set(ref_labels)
        if labels.get(n) != ref_labels.get(n))))
  ref_states, states = stage_states(reference), stage_states(workdir)
  for stage in sorted(set(ref_states) | set(states)):
    if stage not in states or stage not in ref_states:
      diffs.append(f"checkpoints/{stage}: present in one run only")
      continue
    (ref_step, ref_leaves), (step, leaves) = ref_states[stage], states[stage]
    same = step == ref_step and len(leaves) == len(ref_leaves) and all(
        a.dtype == b.dtype and a.shape == b.shape and
        np.asarray(a).tobytes() == np.asarray(b).tobytes()
        for a, b in zip(leaves, ref_leaves))
    if not same:
      diffs.append(f"checkpoints/{stage}: state differs (step {step} vs "
                   f"{ref_step})")
  return diffs


def inspect_kill(workdir: str, stages=STAGES) -> dict:
  """The stage a kill interrupted and what it left half-written."""
  running = next((s for s in stages if not os.path.exists(os.path.join(
      workdir, "checkpoints", s, "stage_done.json"))), "summary")
  ckpt_root = os.path.join(workdir, "checkpoints")
  partial_checkpoint = any(
      "orbax-checkpoint-tmp" in name or ".tmp" in name
      for stage in (os.listdir(ckpt_root) if os.path.isdir(ckpt_root) else ())
      for name in os.listdir(os.path.join(ckpt_root, stage)))
  labels = os.path.join(workdir, "labels")
  partial_shard = os.path.isdir(labels) and any(
      ".tmp" in name for name in os.listdir(labels))
  torn = False
  path = os.path.join(workdir, metrics_lib.METRICS_FILE)
  if os.path.exists(path):
    with open(path, "rb") as f:
      data = f.read()
    torn = bool(data) and not data.endswith(b"\n")
  lock = os.path.join(workdir, "run.lock")
  held = os.path.exists(lock) and os.path.getsize(lock) > 0
  return {"stage": running, "partial_checkpoint": partial_checkpoint,
          "partial_shard": partial_shard, "torn_metrics_line": torn,
          "lock_held": held}


def train_command(config: str, workdir: str, extra=()) -> list:
  return [sys.executable, "-m", "experiments.train", f"--config={config}",
          f"--workdir={workdir}", *extra]


def run_attempt(command, env, log_path, *, kill_at="", should_kill=None,
                timeout=900.0) -> dict:
  """Runs the pipeline once; kills it at a named point (`kill_at`, in the
  process itself) or when `should_kill(seconds since start)` says so."""
  env = dict(env)
  env.pop(kill_points.KILL_ENV, None)
  if kill_at:
    env[kill_points.KILL_ENV] = kill_at
  start = time.time()
  with open(log_path, "a") as log:
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    while proc.poll() is None:
      elapsed = time.time() - start
      if elapsed > timeout:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{command} ran past {timeout} s; see {log_path}")
      if should_kill is not None and should_kill(elapsed):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        break
      time.sleep(0.02)
  return {"returncode": proc.returncode,
          "killed": proc.returncode == -signal.SIGKILL,
          "seconds": time.time() - start}


def stage_timer(workdir, stage, fraction, windows):
  """`should_kill` for a kill a `fraction` of the way into `stage`.

  Waits for the previous stage's done marker, then for `fraction` of the
  stage's span in the reference run, scaled by how much faster or slower
  this run reached the stage (other jobs share the machine).
  """
  before = STAGES[STAGES.index(stage) - 1] if stage != STAGES[0] else None
  first, last = windows[stage]
  when = {}

  def should_kill(elapsed):
    if "at" not in when:
      if before is None:
        when["at"] = fraction * last
      elif os.path.exists(os.path.join(workdir, "checkpoints", before,
                                       "stage_done.json")):
        speed = min(max(elapsed / max(first, 1e-3), 0.3), 3.0)
        when["at"] = elapsed + fraction * (last - first) * speed
      else:
        return False
    return elapsed >= when["at"]

  return should_kill


def _stage_windows(workdir: str, start: float, total: float) -> dict:
  """{stage: (first, last) seconds after the start} in a finished run."""
  last = {}
  for record in metrics_lib.read_metrics(workdir):
    last[record["stage"]] = record["time"] - start
  windows, begin = {}, 0.0
  for stage in STAGES:
    end = last.get(stage, begin)
    windows[stage] = (begin, max(end, begin))
    begin = end
  windows["rl"] = (windows["rl"][0], total)
  return windows


def _point_counts(trace_path: str) -> dict:
  counts = {}
  with open(trace_path) as f:
    for line in f:
      event = json.loads(line)
      counts[event["name"]] = max(counts.get(event["name"], 0),
                                  event["count"])
  return counts


def plan_kill(rng, kind, reference, target_stage=None, restart=False) -> dict:
  """A kill: {"kill_at": "NAME:N[:DELAY]"}, {"target": stage, "fraction"}
  (a timed kill inside that stage) or {"kill_after": seconds}."""
  if kind == "point":
    name = rng.choice(sorted(reference["points"]))
    n = rng.randint(1, reference["points"][name])
    spec = f"{name}:{n}"
    if name == "checkpoint.save" and rng.random() < 0.5:
      spec += f":{rng.uniform(0.0, 0.3):.3f}"  # Inside orbax's write.
    return {"kind": "point", "kill_at": spec}
  if restart:
    return {"kind": "timer", "kill_after": rng.uniform(
        1.0, 0.8 * reference["seconds"])}
  return {"kind": "timer", "target": target_stage,
          "fraction": rng.uniform(0.0, 1.0)}


def reference_runs(config, out, env, extra=()) -> dict:
  """Two uninterrupted runs (the first fills the compilation cache); checks
  they are identical and returns the second's timeline and kill points."""
  runs = []
  for name in ("reference_cold", "reference"):
    workdir = os.path.join(out, name)
    shutil.rmtree(workdir, ignore_errors=True)
    trace = os.path.join(out, f"{name}.trace.jsonl")
    if os.path.exists(trace):
      os.remove(trace)
    run_env = dict(env, **{kill_points.TRACE_ENV: trace})
    start = time.time()
    result = run_attempt(train_command(config, workdir, extra), run_env,
                         os.path.join(out, f"{name}.log"))
    if result["returncode"] != 0:
      raise RuntimeError(f"the {name} run failed; see {out}/{name}.log")
    runs.append((workdir, start, result["seconds"], trace))
  diffs = compare(runs[1][0], runs[0][0])
  if diffs:
    raise RuntimeError(f"two uninterrupted runs differ: {diffs}")
  workdir, start, seconds, trace = runs[1]
  return {"workdir": workdir, "seconds": seconds,
          "cold_seconds": runs[0][2], "points": _point_counts(trace),
          "windows": _stage_windows(workdir, start, seconds)}


def run_trial(index, rng, config, out, env, reference, *, first_kind,
              target_stage, max_kills, again, extra=()) -> dict:
  """One fresh workdir: kill, restart (maybe kill again) until done."""
  trial_dir = os.path.join(out, "trials", f"{index:03d}")
  shutil.rmtree(trial_dir, ignore_errors=True)
  os.makedirs(trial_dir)
  workdir = os.path.join(trial_dir, "workdir")
  command = train_command(config, workdir, extra)
  kills, attempts = [], 0
  plan = plan_kill(rng, first_kind, reference, target_stage)
  while True:
    attempts += 1
    log = os.path.join(trial_dir, f"attempt-{attempts}.log")
    should_kill = None
    if "target" in plan:
      should_kill = stage_timer(workdir, plan["target"], plan["fraction"],
                                reference["windows"])
    elif "kill_after" in plan:
      should_kill = lambda elapsed, after=plan["kill_after"]: elapsed >= after
    result = run_attempt(command, env, log, kill_at=plan.get("kill_at", ""),
                         should_kill=should_kill)
    if result["killed"]:
      kills.append(dict(plan, **inspect_kill(workdir),
                        seconds=result["seconds"]))
    elif result["returncode"] != 0:
      return {"trial": index, "kills": kills, "attempts": attempts,
              "exact": False, "diffs": [f"attempt {attempts} failed with "
                                        f"exit code {result['returncode']}; "
                                        f"see {log}"]}
    else:
      break
    plan = {}
    if len(kills) < max_kills and rng.random() < again:
      plan = plan_kill(rng, rng.choice(["timer", "point"]), reference,
                       restart=True)
  took_over = 0
  for attempt in range(2, attempts + 1):
    with open(os.path.join(trial_dir, f"attempt-{attempt}.log")) as f:
      took_over += "taking over the lock" in f.read()
  diffs = compare(reference["workdir"], workdir)
  if not diffs:
    shutil.rmtree(workdir)
  return {"trial": index, "kills": kills, "attempts": attempts,
          "exact": not diffs, "diffs": diffs, "locks_taken_over": took_over}


def summary(result: dict) -> dict:
  """The published tables' data: the run's exact resumes, then per stage.

  `runs` holds one row (kills, trials, trials and kills that resumed
  exactly); `by_stage` one row per stage a kill interrupted, in pipeline
  order: its kills, how many left a partial checkpoint, label shard or
  metrics line, and how many of those kills were in exact trials
  (`exact_trials` / `trials` count kills, as the table's "trials exact").
  """
  trials = result["trials"]
  kills = [k for t in trials for k in t["kills"]]
  exact_kills = [k for t in trials if t["exact"] for k in t["kills"]]
  mode = "asynchronous" if result["async_save"] else "synchronous"
  runs = [{"run": f"{mode} checkpoints, {result['config']}",
           "kills": len(kills), "trials": len(trials),
           "exact_trials": sum(bool(t["exact"]) for t in trials),
           "exact_kills": len(exact_kills)}]
  by_stage = []
  for stage in STAGES + ("summary",):
    ks = [k for k in kills if k["stage"] == stage]
    if not ks:
      continue
    by_stage.append({
        "stage": stage, "kills": len(ks),
        "partial_checkpoint": sum(bool(k["partial_checkpoint"]) for k in ks),
        "partial_shard": sum(bool(k["partial_shard"]) for k in ks),
        "torn_metrics": sum(bool(k["torn_metrics_line"]) for k in ks),
        "exact_trials": sum(1 for k in exact_kills if k["stage"] == stage),
        "trials": len(ks)})
  return {"runs": runs, "by_stage": by_stage,
          "reference_seconds": result["reference_seconds"],
          "seconds": result["seconds"]}


def tables(result: dict) -> str:
  """Markdown: kills per stage and per kind, exact resumes."""
  trials = result["trials"]
  kills = [k for t in trials for k in t["kills"]]
  exact_kills = [k for t in trials if t["exact"] for k in t["kills"]]
  lines = ["| stage at the kill | kills | left a partial checkpoint | "
           "left a partial label shard | left a torn metrics line | "
           "trials exact |", "|---|---|---|---|---|---|"]
  for stage in STAGES + ("summary",):
    ks = [k for k in kills if k["stage"] == stage]
    if not ks:
      continue
    exact = sum(1 for k in exact_kills if k["stage"] == stage)
    lines.append(f"| {stage} | {len(ks)} | "
                 f"{sum(k['partial_checkpoint'] for k in ks)} | "
                 f"{sum(k['partial_shard'] for k in ks)} | "
                 f"{sum(k['torn_metrics_line'] for k in ks)} | "
                 f"{exact}/{len(ks)} |")
  lines += ["", "| kill | count |", "|---|---|"]
  kinds = {}
  for k in kills:
    key = ("timed" if k["kind"] == "timer" else
           k["kill_at"].split(":")[0] + (" + delay" if k["kill_at"].count(
               ":") == 2 else ""))
    kinds[key] = kinds.get(key, 0) + 1
  lines += [f"| {k} | {v} |" for k, v in sorted(kinds.items())]
  held = sum(k.get("lock_held", False) for k in kills)
  taken = sum(t.get("locks_taken_over", 0) for t in trials)
  lines += ["", f"{len(kills)} kills in {len(trials)} trials; {held} "
            f"killed runs held the workdir's lock (the others were killed "
            f"before taking it or after releasing it) and {taken} restarts "
            f"took it over; "
            f"{sum(t['exact'] for t in trials)}/{len(trials)} trials "
            f"({len(exact_kills)}/{len(kills)} kills) resumed exactly; "
            f"reference run {result['reference_seconds']:.0f} s; "
            f"benchmark {result['seconds'] / 60:.0f} min."]
  return "\n".join(lines)


_CONFIG = flags.DEFINE_string("config", "configs/default.py:size=test",
                              "The pipeline's config (all four stages).")
_OUT = flags.DEFINE_string("out", "runs/faults", "Output directory.", allow_override=True)
_RESULTS = flags.DEFINE_string(
    "results", "", "Also write the published tables' summary here "
    "(docs/results/faults.json), with its provenance.")
_KILLS = flags.DEFINE_integer("kills", 50, "Stop after this many kills.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the kill plans.", allow_override=True)
_ASYNC = flags.DEFINE_bool("async_save", False,
                           "Asynchronous checkpoints (checkpoint.async_save).")
_MAX_KILLS = flags.DEFINE_integer("max_kills_per_trial", 3,
                                  "Kills of one trial at most.")
_AGAIN = flags.DEFINE_float("again", 0.35,
                            "Chance to kill a restarted run again.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=os.path.join(out, "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  extra = ["--config.checkpoint.async_save=true"] if _ASYNC.value else []
  start_info = results_lib.started()
  start = time.time()
  reference = reference_runs(_CONFIG.value, out, env, extra)
  print(f"reference: {reference['seconds']:.0f} s (cold "
        f"{reference['cold_seconds']:.0f} s); stage windows "
        f"{reference['windows']}; kill points {reference['points']}",
        flush=True)
  rng = random.Random(_SEED.value)
  trials, total = [], 0
  while total < _KILLS.value:
    index = len(trials)
    trial = run_trial(
        index, rng, _CONFIG.value, out, env, reference,
        first_kind=("timer", "point")[index % 2],
        target_stage=STAGES[(index // 2) % len(STAGES)],
        max_kills=_MAX_KILLS.value, again=_AGAIN.value, extra=extra)
    trials.append(trial)
    total += len(trial["kills"])
    print(json.dumps(trial), flush=True)
  result = {"config": _CONFIG.value, "async_save": _ASYNC.value,
            "seed": _SEED.value, "reference_seconds": reference["seconds"],
            "points": reference["points"],
            "windows": reference["windows"], "trials": trials,
            "kills": total, "seconds": time.time() - start}
  results_lib.write(os.path.join(out, "faults.json"), result, start_info)
  if _RESULTS.value:
    results_lib.write(_RESULTS.value, summary(result), start_info)
  text = tables(result)
  with open(os.path.join(out, "faults.md"), "w") as f:
    f.write(text + "\n")
  print(text)


if __name__ == "__main__":
  app.run(main)
