"""The sections of `accelerator.py` that run the whole pipeline as a user
does (`python -m experiments.train`): one `configs/qwen_gsm8k.py` RL step
at 1.5B with the GPU's busy fraction by phase, and the default job."""

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

from experiments.benchmarks.accelerator_sections import CPU_DEFAULT_JOB_S
from experiments.benchmarks.accelerator_sections import Section


class _UtilisationSampler:
  """GPU utilisation (NVML `utilization.gpu`: the share of the last sample
  period in which a kernel ran) every `period` seconds, in a thread."""

  def __init__(self, period=0.05):
    self.samples = []
    self._stop = threading.Event()
    self._period = period
    try:
      import pynvml  # pylint: disable=g-import-not-at-top
      pynvml.nvmlInit()
      self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
      self._read = lambda: pynvml.nvmlDeviceGetUtilizationRates(
          self._handle).gpu
    except Exception:  # pylint: disable=broad-except
      self._read = None
    self._thread = threading.Thread(target=self._loop, daemon=True)

  @property
  def available(self):
    return self._read is not None

  def _loop(self):
    while not self._stop.is_set():
      self.samples.append((time.time(), self._read()))
      time.sleep(self._period)

  def __enter__(self):
    if self.available:
      self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()

  def busy(self, start, end):
    values = [u for t, u in self.samples if start <= t <= end]
    return statistics.mean(values) / 100 if values else None


def _run_until(command, env, workdir, log, done, timeout):
  """Runs `command`, polling `<workdir>/metrics.jsonl`; stops it (SIGTERM,
  then SIGKILL) once `done(records)` or after `timeout` seconds. Returns
  (return code or None when stopped, seconds, {record index: time seen})."""
  from rl_rewards import metrics  # pylint: disable=g-import-not-at-top
  start = time.time()
  seen = {}
  # The child stays in this process group: stopping the section stops it.
  proc = subprocess.Popen(command, env=env, stdout=log, stderr=log)
  finished = False
  while time.time() - start < timeout:
    if proc.poll() is not None:
      finished = True
      break
    records = (metrics.read_metrics(workdir)
               if os.path.exists(os.path.join(workdir, "metrics.jsonl"))
               else [])
    for i in range(len(records)):
      seen.setdefault(i, time.time())
    if done(records):
      break
    time.sleep(0.05)
  seconds = time.time() - start
  if not finished:
    proc.terminate()
    try:
      proc.wait(10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  return (proc.returncode if finished else None), seconds, seen


def _synthetic_gsm8k(path, rows=64):
  """GSM8K-format rows (`question`, `answer` ending in "#### x")."""
  os.makedirs(path, exist_ok=True)
  out = {}
  for split, count, seed in (("train", rows, 0), ("test", 8, 1)):
    lines = []
    for i in range(count):
      a, b = 3 + (7 * i + seed) % 40, 2 + (5 * i + seed) % 30
      lines.append(json.dumps({
          "question": f"Tom has {a} apples and buys {b} more. How many "
                      "apples does Tom have now?",
          "answer": f"Tom has {a} + {b} = {a + b} apples.\n#### {a + b}"}))
    out[split] = os.path.join(path, f"{split}.jsonl")
    with open(out[split], "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return out


_RL_PHASES = (("rollout", "time/rollout_s"), ("reward", "time/reward_s"),
              ("reference", "time/prm_s"), ("advantages", "time/advantage_s"),
              ("update", "time/update_s"))


def section_rl_step(s: Section):
  """One whole RL step of `configs/qwen_gsm8k.py` (the second: the first
  compiles), phases and GPU busy fraction."""
  from rl_rewards.models import tiny_hub  # pylint: disable=g-import-not-at-top

  z = s.sizes
  ckpt_dir = os.path.join(s.workdir, "rl_checkpoint")
  tiny_hub.write_checkpoint(ckpt_dir, "qwen2")
  big = s.read("train").get("checkpoint")
  if big and not s.dry_run:  # The 1.5B weights under the tokenizer.
    for name in ("config.json", "model.safetensors"):
      _link(os.path.join(big, name), os.path.join(ckpt_dir, name))
  data = _synthetic_gsm8k(os.path.join(s.workdir, "gsm8k"))
  workdir = os.path.join(s.workdir, "rl_run")
  command = [sys.executable, "-m", "experiments.train",
             f"--config={z['rl_config']}",
             f"--config.model.hf_path={ckpt_dir}",
             f"--config.task.train_path={data['train']}",
             f"--config.task.eval_path={data['test']}",
             *z["rl_overrides"], f"--workdir={workdir}"]
  s.put(command=" ".join(command[1:]))

  def rl_steps(records):
    return [r for r in records if r.get("stage") == "rl" and
            "time/step_s" in r]

  log_path = os.path.join(s.workdir, "rl_step.log")
  with open(log_path, "w") as log, _UtilisationSampler() as util:
    rc, seconds, seen = _run_until(
        command, _accelerator_env(), workdir, log,
        lambda records: len(rl_steps(records)) >= 2,
        s.deadline - time.time() - 10)
  with open(log_path, encoding="utf-8", errors="replace") as f:
    print(f.read()[-4000:], flush=True)
  from rl_rewards import metrics  # pylint: disable=g-import-not-at-top
  records = (metrics.read_metrics(workdir)
             if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else [])
  steps = rl_steps(records)
  s.put(return_code=rc, run_s=seconds, rl_steps_recorded=len(steps),
        nvml=util.available)
  for index, record in enumerate(steps):
    row = {"step": record.get("step"), "step_s": record["time/step_s"],
           **{name: record.get(key) for name, key in _RL_PHASES},
           "rollout_tokens": record.get("perf/tokens_per_sec", 0) *
                             record["time/step_s"],
           # The update's losses, and whether the non-finite guard skipped it.
           **{key: value for key, value in record.items()
              if key.startswith("train/") and ("loss" in key or "kl" in key
                                              or "skipped" in key)}}
    row["losses_finite"] = all(
        math.isfinite(v) for k, v in row.items()
        if k.startswith("train/") and "loss" in k and isinstance(v, float))
    position = records.index(record)
    if util.available and position in seen:
      end = seen[position] - record.get("time/eval_s", 0.0)
      begin = end - record["time/step_s"]
      row["gpu_busy"] = util.busy(begin, end)
      cursor = begin
      for name, key in _RL_PHASES:
        if name == "reward":  # Scoring follows sampling inside the rollout.
          continue
        length = record.get(key) or 0.0
        if name == "rollout":
          length += record.get("time/reward_s") or 0.0
        row[f"gpu_busy_{name}"] = util.busy(cursor, cursor + length)
        cursor += length
    s.put(**{f"step_{index + 1}": row})


def _link(src, dst):
  if os.path.lexists(dst):
    os.remove(dst)
  os.symlink(os.path.abspath(src), dst)


def _accelerator_env() -> dict:
  """The environment of a child that should use the accelerator."""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  if env.get("ACCELERATOR_CHILD_PLATFORMS"):
    env["JAX_PLATFORMS"] = env["ACCELERATOR_CHILD_PLATFORMS"]
  return env


def section_default_job(s: Section):
  """`python -m experiments.train`: wall time and each stage's seconds."""
  from rl_rewards import metrics  # pylint: disable=g-import-not-at-top
  z = s.sizes
  workdir = os.path.join(s.workdir, "default_job")
  command = [sys.executable, "-m", "experiments.train", *z["default_job_args"],
             f"--workdir={workdir}"]
  s.put(command=" ".join(command[1:]), cpu_wall_s=CPU_DEFAULT_JOB_S)
  log_path = os.path.join(s.workdir, "default_job.log")
  with open(log_path, "w") as log:
    rc, seconds, _ = _run_until(command, _accelerator_env(), workdir, log,
                                lambda records: False,
                                s.deadline - time.time() - 10)
  with open(log_path, encoding="utf-8", errors="replace") as f:
    print(f.read()[-3000:], flush=True)
  records = (metrics.read_metrics(workdir)
             if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else [])
  stages = {}
  for r in records:
    stage = r.get("stage")
    if stage and "time/step_s" in r:
      stages[stage] = stages.get(stage, 0.0) + r["time/step_s"]
  s.put(return_code=rc, finished=rc == 0, wall_s=seconds,
        stage_step_seconds=stages, records=len(records))
