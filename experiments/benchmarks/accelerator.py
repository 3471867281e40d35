r"""The whole pipeline on one accelerator, and how close to the hardware it runs.

One command runs every check in its own process (so that one failure, an
out-of-memory or a hang loses one section, not the run), within a total time
budget, and writes `accelerator.json` (every section's numbers) and
`accelerator.log` (every process's output) to `--out_dir`:

  python -m experiments.benchmarks.accelerator --out_dir=/tmp/accel

Sections, in order (`--sections` picks some):

  probe        the device, and the two ceilings measured on it: a bf16
               matmul (N x N x N, random data; TFLOP/s = 2N³/t) and a device
               copy (bytes read + written over t).
  correctness  Qwen2.5-0.5B shapes, random weights: the accelerator's
               logits (bfloat16 activations, float32 weights, the attention
               implementation that ran named from the compiled HLO; and
               with bfloat16 weights, the sampler's copy) against the CPU's
               float32 forward on the same weights, ‖Δ‖/‖ref‖ over real
               tokens; greedy decoding on the accelerator in float32
               (`highest` matmul precision) token-identical to the CPU's, and
               in bfloat16 the agreement up to the first divergence.
  train        Qwen2.5-1.5B shapes: our jitted SFT and policy steps (as the
               runners jit them) on B x 2048 tokens, bfloat16 activations,
               tokens/s and MFU (6N + attention, causal and non-causal) over
               the measured matmul peak, with remat "none" (the dry run also
               times "full", the setting `rl_step` runs), and a profile of
               one step's kernels. Writes the checkpoint and the batches the
               PyTorch sections read.
  train_torch  the transformers/torch step of `train_step.py` (autocast
               bfloat16, fused AdamW) on the same weights and batch.
  sample       our sampler (bfloat16 copy of the weights, 128-token prompts,
               512 new tokens, no early stop) at batch 64 and 256: tokens/s
               and MBU = (weight bytes + KV-cache bytes of the real tokens,
               read once per decoding step) / time / measured copy rate.
  sample_cublas  `sample` at the first batch size with XLA's Triton GEMM
               fusions off (`--xla_gpu_enable_triton_gemm=false`): whether
               the LM head's GEMM fusion, a quarter of the decoding time at
               batch 64 on an H200, runs closer to the copy rate in cuBLAS.
  rl_step      `configs/qwen_gsm8k.py` at 1.5B on synthetic GSM8K rows (a
               word-level tokenizer and random weights, so responses end at
               a randomly drawn end-of-turn token or at 512 tokens): the
               second RL step's seconds split into rollout, reward,
               reference pass, advantages and update, with the GPU's busy
               fraction in each (NVML utilisation sampled every 50 ms).
  default_job  `python -m experiments.train` as the README runs it: wall
               time and each stage's seconds.
  sample_hf    transformers `generate` (bfloat16, SDPA) on the same weights
               and prompts (last: at about 75 ms a token it is the slowest).

The scratch directory (checkpoints, batches, run workdirs) is on /dev/shm
when it has room: writing the 6 GB float32 checkpoint to the device
machine's disk took 70 s.

`--dry_run` runs the same code paths at toy sizes on any backend (the test
suite runs it on CPU); sections whose libraries are missing (torch, NVML)
are reported as skipped.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

from experiments.benchmarks import accelerator_runs as runs
from experiments.benchmarks import accelerator_sections as sections_lib
from experiments.benchmarks import results as results_lib
from experiments.benchmarks.accelerator_sections import SECTION_CAPS_S
from experiments.benchmarks.accelerator_sections import SECTION_ENV
from experiments.benchmarks.accelerator_sections import SECTIONS
from experiments.benchmarks.accelerator_sections import sizes

_OUT_DIR = flags.DEFINE_string("out_dir", None,
                               "Where accelerator.json and .log go.")
_SECTIONS = flags.DEFINE_list("sections", None,
                              "Sections to run (default: all, in order).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Toy sizes, any backend.")
_BUDGET_S = flags.DEFINE_float("budget_s", 560.0,
                               "Total seconds for all sections.")
_SAMPLE_BATCHES = flags.DEFINE_list(
    "sample_batches", None,
    "Batch sizes of the sampling sections (default: 64,256; toy: 2,4).")
_SECTION = flags.DEFINE_string("section", None,
                               "Internal: run this one section here.")
_WORKDIR = flags.DEFINE_string("section_workdir", None,
                               "Internal: the run's scratch directory.")
_SECTION_TIMEOUT_S = flags.DEFINE_float(
    "section_timeout_s", None, "Internal: seconds this section may take.")

# Sections that only start other processes or read files keep JAX off the
# accelerator, so the process that times the work has it to itself.
_CPU_ONLY_SECTIONS = ("rl_step", "default_job")


def _stop_group(proc):
  """Stops the process group `proc` leads (SIGTERM, then SIGKILL)."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
      os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
      return
    try:
      proc.wait(10)
    except subprocess.TimeoutExpired:
      pass
    time.sleep(0.5)




SECTION_FNS = {
    "probe": sections_lib.section_probe,
    "correctness": sections_lib.section_correctness,
    "train": sections_lib.section_train,
    "train_torch": sections_lib.section_train_torch,
    "sample": sections_lib.section_sample,
    "sample_cublas": sections_lib.section_sample_cublas,
    "sample_hf": sections_lib.section_sample_hf,
    "rl_step": runs.section_rl_step,
    "default_job": runs.section_default_job,
}



# -------------------------------------------------------- the orchestrator --


def _missing_library(name: str):
  """Why section `name` cannot run here, or None."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if name in ("train_torch", "sample_hf"):
    for module in ("torch", "transformers"):
      if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
  return None


def _run_section(name, workdir, dry_run, timeout, log, sample_batches=None):
  """Runs one section in its own process; returns its record."""
  missing = _missing_library(name)
  if missing:
    return {"status": "skipped", "why": missing}
  command = [sys.executable, "-m", "experiments.benchmarks.accelerator",
             f"--section={name}", f"--section_workdir={workdir}",
             f"--section_timeout_s={timeout}"]
  if dry_run:
    command.append("--dry_run")
  if sample_batches:
    command.append(f"--sample_batches={','.join(map(str, sample_batches))}")
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  for key, value in SECTION_ENV.get(name, {}).items():
    env[key] = f"{env.get(key, '')} {value}".strip()
  if name in _CPU_ONLY_SECTIONS:
    env["ACCELERATOR_CHILD_PLATFORMS"] = env.get("JAX_PLATFORMS", "")
    env["JAX_PLATFORMS"] = "cpu"
  start = time.time()
  proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True,
                          text=True, errors="replace")
  tail = []

  def pump():
    for line in proc.stdout:
      log.write(line)
      log.flush()
      tail.append(line)
      del tail[:-40]
      if line.startswith(f"[{name}]") or "Error" in line:
        sys.stdout.write(line[:600] + ("\n" if len(line) > 600 else ""))
        sys.stdout.flush()

  reader = threading.Thread(target=pump, daemon=True)
  reader.start()
  try:
    proc.wait(timeout)
    status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
  except subprocess.TimeoutExpired:
    status = f"timed out after {timeout:.0f} s"
  _stop_group(proc)  # Also whatever the section left running.
  reader.join(5)
  record = {"status": status, "wall_s": time.time() - start}
  if status != "ok":
    record["output_tail"] = "".join(tail[-15:])
  path = os.path.join(workdir, f"{name}.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      record["results"] = json.load(f)
  return record


def scratch_root(min_free_gib: float = 24.0):
  """/dev/shm when it has `min_free_gib` free, else the default temporary
  directory (None)."""
  with contextlib.suppress(OSError):
    stat = os.statvfs("/dev/shm")
    if stat.f_bavail * stat.f_frsize >= min_free_gib * 2**30:
      return "/dev/shm"
  return None


def run(out_dir: str, sections, dry_run: bool, budget_s: float,
        sample_batches=None) -> dict:
  """Runs `sections` in order within `budget_s`; writes and returns the
  results ({"sections": {name: record}, ...}). `sample_batches` replaces
  the sampling sections' batch sizes."""
  for name in sections:
    if name not in SECTION_FNS:
      raise SystemExit(f"--sections: unknown section {name!r}; expected some "
                       f"of {', '.join(SECTIONS)}.")
  os.makedirs(out_dir, exist_ok=True)
  start = results_lib.started()
  began = time.time()
  out = {"dry_run": dry_run, "budget_s": budget_s, "sections": {},
         "sizes": {k: list(v) if isinstance(v, tuple) else v
                   for k, v in sizes(dry_run, sample_batches).items()}}
  json_path = os.path.join(out_dir, "accelerator.json")
  with tempfile.TemporaryDirectory(prefix="accelerator_",
                                   dir=scratch_root()) as workdir, open(
      os.path.join(out_dir, "accelerator.log"), "a", encoding="utf-8") as log:
    for name in sections:
      left = budget_s - (time.time() - began)
      if left < 15:
        out["sections"][name] = {"status": "skipped",
                                 "why": "the time budget was spent"}
        continue
      timeout = min(SECTION_CAPS_S[name], left)
      print(f"== {name} (up to {timeout:.0f} s)", flush=True)
      log.write(f"\n== {name}\n")
      out["sections"][name] = _run_section(name, workdir, dry_run, timeout,
                                           log, sample_batches)
      print(f"== {name}: {out['sections'][name]['status']} in "
            f"{out['sections'][name].get('wall_s', 0):.0f} s", flush=True)
      out["total_s"] = time.time() - began
      results_lib.write(json_path, out, start)
  print_summary(out)
  return out


def _get(out, section, *keys):
  value = out["sections"].get(section, {}).get("results", {})
  for key in keys:
    if isinstance(value, dict):
      value = value.get(key)
    elif isinstance(value, list) and isinstance(key, int) and key < len(value):
      value = value[key]
    else:
      return None
  return value


def print_summary(out: dict):
  """The headline numbers, one line each."""
  print("\n| section | status | seconds |\n|---|---|---|")
  for name, record in out["sections"].items():
    print(f"| {name} | {record['status']} | {record.get('wall_s', 0):.0f} |")
  probe = out["sections"].get("probe", {}).get("results", {})
  if probe:
    print(f"\n{probe.get('device_kind')}: bf16 matmul "
          f"{probe.get('matmul_tflops', 0):.0f} TFLOP/s, copy "
          f"{probe.get('copy_gb_s', 0):.0f} GB/s")
  for row in _get(out, "train", "rows") or ():
    print(f"train {row['step']} remat={row['remat']}: "
          f"{row['tokens_per_s']:,.0f} tok/s, MFU causal "
          f"{row.get('mfu_causal', float('nan')):.1%}")
  for row in _get(out, "train_torch", "rows") or ():
    print(f"torch {row['step']}: {row['tokens_per_s']:,.0f} tok/s")
  for row in _get(out, "sample", "rows") or ():
    print(f"sample B={row['batch']}: {row['tokens_per_s']:,.0f} tok/s, MBU "
          f"{row.get('mbu', float('nan')):.1%}")
  for row in _get(out, "sample_hf", "rows") or ():
    print(f"generate B={row['batch']}: {row['tokens_per_s']:,.0f} tok/s")


def _sample_batches():
  """--sample_batches as positive ints, or None."""
  if not _SAMPLE_BATCHES.value:
    return None
  try:
    batches = tuple(int(b) for b in _SAMPLE_BATCHES.value)
  except ValueError:
    batches = ()
  if not batches or min(batches) < 1:
    raise SystemExit(f"--sample_batches: expected positive integers, got "
                     f"{','.join(_SAMPLE_BATCHES.value)!r}.")
  return batches


def main(argv):
  del argv
  if _SECTION.value:
    section = sections_lib.Section(_SECTION.value, _WORKDIR.value,
                                   _DRY_RUN.value, _SECTION_TIMEOUT_S.value,
                                   _sample_batches())
    SECTION_FNS[_SECTION.value](section)
    return
  if not _OUT_DIR.value:
    raise SystemExit("--out_dir is required.")
  run(_OUT_DIR.value, _SECTIONS.value or list(SECTIONS), _DRY_RUN.value,
      _BUDGET_S.value, _sample_batches())


if __name__ == "__main__":
  app.run(main)
