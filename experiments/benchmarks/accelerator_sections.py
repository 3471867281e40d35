"""The sections of `accelerator.py` that time one program in one process:
probe, correctness, train, train_torch, sample, sample_cublas, sample_hf,
with the sizes they run at and the arithmetic of their figures (MFU, MBU,
relative errors). `accelerator.py` describes each section."""

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SECTIONS = ("probe", "correctness", "train", "train_torch", "sample",
            "sample_cublas", "rl_step", "default_job", "sample_hf")
# Most seconds each section may take (the budget left caps it further).
# Measured on an H200 (jax 0.11.2): probe 9, correctness over 75 (compiling
# the unrolled 0.5B sampler three times), train 109 (70 of them writing the
# checkpoint to disk), train_torch 28, sample 55 a batch size, sample_hf 38
# a batch size, rl_step 97, default_job 90.
SECTION_CAPS_S = {"probe": 40, "correctness": 150, "train": 140,
                  "train_torch": 75, "sample": 120, "sample_cublas": 100,
                  "rl_step": 170, "default_job": 150, "sample_hf": 110}
# Extra environment of a section's process.
SECTION_ENV = {"sample_cublas": {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm="
                                              "false"}}
DATASHEET_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16.
CPU_DEFAULT_JOB_S = 353.0      # docs/performance.md: 5 min 53 s, 2 cores.

_HF_SHAPES = os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                          "hf_shapes")
# A Qwen2-style config small enough for the dry run.
_TOY_HF_CONFIG = {
    "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}

REAL = {
    "correctness_model": "qwen2.5-0.5b", "correctness_batch": 2,
    "correctness_len": 64, "greedy_prompt": 16, "greedy_new": 24,
    "model": "qwen2.5-1.5b", "train_batch": 8, "train_len": 2048,
    "train_repeats": 5, "remats": ("none",),
    "sample_batches": (64, 256), "prompt_len": 128, "new_tokens": 512,
    "sample_repeats": 2, "matmul_n": 8192, "copy_mib": 2048,
    "rl_config": "configs/qwen_gsm8k.py",
    "rl_overrides": ("--config.rl.steps=3", "--config.eval.size_per_k=8",
                     "--config.eval.batch_size=8",
                     "--config.eval.pass_size=8"),
    "default_job_args": (),
}
DRY = {
    "correctness_model": None, "correctness_batch": 2, "correctness_len": 12,
    "greedy_prompt": 6, "greedy_new": 6,
    "model": None, "train_batch": 2, "train_len": 32, "train_repeats": 2,
    "remats": ("none", "full"), "sample_batches": (2, 4), "prompt_len": 8,
    "new_tokens": 8, "sample_repeats": 1, "matmul_n": 128, "copy_mib": 4,
    "rl_config": "configs/qwen_gsm8k.py:smoke",
    "rl_overrides": ("--config.rl.steps=3",),
    "default_job_args": ("--config=configs/default.py:size=test",),
}


def sizes(dry_run: bool, sample_batches=None) -> dict:
  """The sizes of a real or dry run; `sample_batches` replaces the
  sampling sections' batch sizes."""
  chosen = dict(DRY if dry_run else REAL)
  if sample_batches:
    chosen["sample_batches"] = tuple(sample_batches)
  return chosen


# ----------------------------------------------------------- arithmetic --


def hf_model_config(name, **overrides):
  """`ModelConfig` of a `configs/hf_shapes` directory (None: the toy)."""
  from rl_rewards.models import hf  # pylint: disable=g-import-not-at-top
  raw = (dict(_TOY_HF_CONFIG) if name is None else hf.read_hf_config(
      os.path.join(_HF_SHAPES, name, "config.json")))
  return hf.config_from_hf(raw).replace(**overrides)


def relative_error(out, ref, mask) -> float:
  """‖out − ref‖ / ‖ref‖ over the [B, T] positions where mask is set."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  keep = np.asarray(mask, bool)
  a = np.asarray(out, np.float64)[keep]
  b = np.asarray(ref, np.float64)[keep]
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def agreement_prefix(a, b) -> int:
  """Leading positions where rows of a and b agree in every row: the
  smallest first-divergence index over rows ([B, G] token arrays)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  a, b = np.asarray(a), np.asarray(b)
  differ = a != b
  first = np.where(differ.any(1), differ.argmax(1), a.shape[1])
  return int(first.min())


def decode_bytes(cfg, prompt_mask, new_tokens: int, weight_bytes: int
                 ) -> dict:
  """Bytes a decoding loop must read from device memory at the least.

  Each of the G steps reads every weight once (`weight_bytes`) and, for
  each row, the keys and values of its real tokens so far:

    kv_bytes(step i, row b) = (P_b + i) · L · 2 · KVH · Dh · 2  (bfloat16)

  with P_b the real prompt tokens of row b.

  Returns:
    {"weight_bytes", "kv_bytes", "total_bytes"} summed over the G steps.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
  prompt = np.asarray(prompt_mask).sum(1).astype(np.float64)
  steps = np.arange(new_tokens, dtype=np.float64)
  kv = float((prompt[:, None] + steps[None]).sum() * per_token)
  weights = float(weight_bytes) * new_tokens
  return {"weight_bytes": weights, "kv_bytes": kv,
          "total_bytes": weights + kv}


def left_padded_prompts(batch: int, prompt_len: int, vocab_size: int,
                        seed: int):
  """[B, P] random ids with 0 .. P/4 left-padding slots per row, and mask."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  pads = rs.randint(0, prompt_len // 4 + 1, (batch, 1))
  mask = (np.arange(prompt_len)[None] >= pads).astype(np.int32)
  tokens = np.where(mask, rs.randint(1, vocab_size, (batch, prompt_len)), 0)
  return tokens.astype(np.int32), mask


def _median_seconds(fn, repeats: int) -> tuple:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


# ------------------------------------------------------------- sections --


class Section:
  """What a section process writes: `<workdir>/<name>.json`, rewritten
  after every result so a timeout keeps what was measured."""

  def __init__(self, name, workdir, dry_run, timeout_s=None,
               sample_batches=None):
    self.name, self.workdir, self.dry_run = name, workdir, dry_run
    self.deadline = time.time() + (timeout_s or SECTION_CAPS_S[name])
    self.sizes = sizes(dry_run, sample_batches)
    self.data = {}

  def put(self, **values):
    self.data.update(values)
    path = os.path.join(self.workdir, f"{self.name}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(self.data, f, indent=1, default=float)
    os.replace(path + ".tmp", path)
    print(f"[{self.name}] {json.dumps(values, default=float)}", flush=True)

  def read(self, name) -> dict:
    path = os.path.join(self.workdir, f"{name}.json")
    if not os.path.exists(path):
      return {}
    with open(path, encoding="utf-8") as f:
      return json.load(f)


def _device_info() -> dict:
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  info = {"backend": jax.default_backend(), "device_kind": device.device_kind,
          "devices": jax.device_count(), "python": sys.version.split()[0]}
  for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      info[name] = importlib.metadata.version(name)
  try:
    stats = device.memory_stats() or {}
    info["memory_gib"] = stats.get("bytes_limit", 0) / 2**30
  except Exception:  # pylint: disable=broad-except
    pass
  return info


def section_probe(s: Section):
  """The device, its bf16 matmul rate and its copy bandwidth."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  s.put(**_device_info())
  with contextlib.suppress(OSError, subprocess.SubprocessError):
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
         "clocks.sm,clocks.max.sm,power.limit", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20, check=False)
    s.put(nvidia_smi=smi.stdout.strip())
  n = s.sizes["matmul_n"]
  keys = jax.random.split(jax.random.key(0), 2)
  a = jax.random.normal(keys[0], (n, n), jnp.bfloat16)
  b = jax.random.normal(keys[1], (n, n), jnp.bfloat16)
  matmul = jax.jit(lambda a, b: a @ b)
  for _ in range(3):
    matmul(a, b).block_until_ready()
  calls = 10
  def ten_matmuls():
    out = None
    for _ in range(calls):
      out = matmul(a, b)
    out.block_until_ready()
  seconds, _ = _median_seconds(ten_matmuls, 5)
  s.put(matmul_n=n, matmul_tflops=2 * n**3 * calls / seconds / 1e12)
  elements = s.sizes["copy_mib"] * 2**20 // 2
  x = jax.random.normal(keys[0], (elements,), jnp.bfloat16)
  copy = jax.jit(lambda x: x * 2)
  for _ in range(3):
    copy(x).block_until_ready()
  def ten_copies():
    out = None
    for _ in range(calls):
      out = copy(x)
    out.block_until_ready()
  seconds, _ = _median_seconds(ten_copies, 5)
  s.put(copy_mib=s.sizes["copy_mib"],
        copy_gb_s=2 * elements * 2 * calls / seconds / 1e9)


def _attention_targets(compiled_text: str) -> list:
  """Custom-call targets of attention kernels in compiled HLO text."""
  targets = set(re.findall(r'custom_call_target="([^"]+)"', compiled_text))
  return sorted(t for t in targets if "fmha" in t.lower() or
                "attention" in t.lower() or "flash" in t.lower())


def section_correctness(s: Section):
  """Accelerator forward and greedy decoding against the CPU's float32."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.rollout import sampler  # pylint: disable=g-import-not-at-top

  z = s.sizes
  cfg32 = hf_model_config(z["correctness_model"])
  cfg16 = cfg32.replace(dtype="bfloat16")
  s.put(model=z["correctness_model"] or "toy", params=models.num_params(cfg32),
        **_device_info())
  cpu = jax.devices("cpu")[0]
  params = models.init_params(cfg32, jax.random.key(1))
  params16 = jax.tree.map(lambda x: x.astype("bfloat16"), params)
  with jax.default_device(cpu):
    params_cpu = jax.device_put(params, cpu)
  tokens, mask = left_padded_prompts(z["correctness_batch"],
                                     z["correctness_len"], cfg32.vocab_size,
                                     seed=3)

  def forward(cfg, p):
    return jax.jit(lambda p, t, m: models.apply(cfg, p, t,
                                                attention_mask=m)[0])

  with jax.default_device(cpu):
    ref = np.asarray(forward(cfg32, params_cpu)(params_cpu, tokens, mask))
  compiled16 = forward(cfg16, params).lower(params, tokens, mask).compile()
  targets = _attention_targets(compiled16.as_text())
  s.put(attention_custom_calls=targets,
        attention_implementation=("cudnn" if any("cudnn" in t for t in targets)
                                  else "xla"))
  out16 = np.asarray(compiled16(params, tokens, mask))
  out16w = np.asarray(forward(cfg16, params16)(params16, tokens, mask))
  with jax.default_matmul_precision("highest"):
    out32 = np.asarray(forward(cfg32, params)(params, tokens, mask))
  argmax_agree = lambda a: float((a.argmax(-1) == ref.argmax(-1))[
      mask.astype(bool)].mean())
  s.put(logits_rel_err_bf16=relative_error(out16, ref, mask),
        logits_rel_err_bf16_weights=relative_error(out16w, ref, mask),
        logits_rel_err_f32=relative_error(out32, ref, mask),
        argmax_agreement_bf16=argmax_agree(out16),
        argmax_agreement_bf16_weights=argmax_agree(out16w),
        tolerance_bf16=BF16_TOLERANCE, tolerance_f32=F32_TOLERANCE)

  prompts, pmask = left_padded_prompts(z["correctness_batch"],
                                       z["greedy_prompt"], cfg32.vocab_size,
                                       seed=4)
  # Scanned layers: one compiled layer instead of L, the same arithmetic.
  scan = lambda cfg: cfg.replace(scan_layers=True)
  params = models.stack_layers(cfg32, params)
  params16 = models.stack_layers(cfg32, params16)
  with jax.default_device(cpu):
    params_cpu = jax.device_put(params, cpu)

  def greedy(cfg, p):
    cfg = scan(cfg)
    out = sampler.sample(cfg, p, prompts, pmask, jax.random.key(0),
                         max_new_tokens=z["greedy_new"], temperature=0.0,
                         eos_id=None, pad_id=0)
    return np.asarray(out.tokens)[:, -z["greedy_new"]:]
  with jax.default_device(cpu):
    greedy_cpu = greedy(cfg32, params_cpu)
  with jax.default_matmul_precision("highest"):
    greedy32 = greedy(cfg32, params)
  greedy16 = greedy(cfg16, params16)
  s.put(greedy_new_tokens=z["greedy_new"],
        greedy_f32_identical=bool((greedy32 == greedy_cpu).all()),
        greedy_bf16_agreement=float((greedy16 == greedy_cpu).mean()),
        greedy_bf16_first_divergence=agreement_prefix(greedy16, greedy_cpu))


# Kernel-name patterns of each kind of device work (first match wins).
KERNEL_KINDS = (
    ("attention", r"fmha|flash|cudnn|attention"),
    ("matmul", r"gemm|cutlass|nvjet|xmma|matmul|dot|cublas|wgmma"),
    ("copy", r"copy|memcpy|memset|transpose|dynamic_update_slice"),
    ("reduction", r"reduce|reduction|scatter|sort|select_and"),
)


def kernel_kind(name: str) -> str:
  for kind, pattern in KERNEL_KINDS:
    if re.search(pattern, name, re.IGNORECASE):
      return kind
  return "elementwise/fusion"


def device_profile(call, top: int = 20) -> dict:
  """One `call()` under `jax.profiler`: the device's kernel time by kind
  and its `top` kernels, and the call's wall time.

  Kernels are the events on the device planes (`/device:GPU:N`); their
  summed duration over the wall time is the device's busy fraction (one
  stream). Without a device plane (CPU) only the wall time is returned.
  """
  try:
    return _device_profile(call, top)
  except Exception as e:  # pylint: disable=broad-except
    # A profiler that cannot start (no CUPTI) must not lose the timings.
    return {"error": f"{type(e).__name__}: {e}"[:500]}


def _device_profile(call, top):
  import glob  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir):
      start = time.perf_counter()
      call()
      wall = time.perf_counter() - start
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                     recursive=True)[0]
    profile = jax.profiler.ProfileData.from_file(path)
  by_name, count = {}, 0
  for plane in profile.planes:
    if not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      if "stream" not in line.name.lower():
        continue
      for event in line.events:
        by_name[event.name] = by_name.get(event.name, 0.0) + (
            event.duration_ns / 1e6)
        count += 1
  kinds = {}
  for name, ms in by_name.items():
    kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + ms
  busy = sum(by_name.values())
  ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
  return {"wall_ms": wall * 1e3, "kernel_ms": busy, "kernels": count,
          "busy_fraction": busy / (wall * 1e3) if busy else None,
          "kinds_ms": kinds,
          "top_kernels": [{"name": n[:160], "ms": ms} for n, ms in ranked]}


BF16_TOLERANCE = 5e-2  # ‖Δ‖/‖ref‖ of the logits, bfloat16 activations.
F32_TOLERANCE = 1e-4   # The same in float32 with `highest` precision.


def _train_cfg(z, remat):
  return hf_model_config(z["model"], dtype="bfloat16", scan_layers=True,
                         remat=remat)


def ensure_checkpoint(s: Section) -> str:
  """The float32 checkpoint of `sizes()["model"]` (random weights, seed 0)
  that both frameworks read: the one an earlier section of the run wrote,
  or written now (so that `--sections=sample,sample_hf` runs alone)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  for name in ("train", "sample"):
    if s.read(name).get("checkpoint"):
      return s.read(name)["checkpoint"]
  path = os.path.join(s.workdir, "checkpoint")
  start = time.perf_counter()
  cfg = hf_model_config(s.sizes["model"])
  models.save_hf(path, cfg, models.init_params(cfg, jax.random.key(0)))
  s.put(checkpoint=path, checkpoint_write_s=time.perf_counter() - start)
  return path


def section_train(s: Section):
  """Our SFT and policy steps: tokens/s and MFU; writes the checkpoint and
  the batches the PyTorch section reads."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import context  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  z = s.sizes
  b, t = z["train_batch"], z["train_len"]
  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1},
                            jax.devices()[:1])
  cfg = _train_cfg(z, "none")
  peak = s.read("probe").get("matmul_tflops")
  s.put(model=z["model"] or "toy", params=models.num_params(cfg),
        matmul_params=ts.matmul_params(cfg), batch=b, seq_len=t,
        measured_peak_tflops=peak, **_device_info())
  path = ensure_checkpoint(s)
  rows = []
  flops = ts.flops_per_token(cfg, t)
  with mesh_lib.activate(mesh):
    for remat in z["remats"]:
      cfg = _train_cfg(z, remat)
      _, params = models.load_hf(path, dtype="bfloat16", scan_layers=True,
                                 remat=remat)
      for kind in ("sft", "policy"):
        batch_np = ts.step_batch(kind, cfg, params, b, t)
        if remat == z["remats"][0]:
          np.savez(os.path.join(s.workdir, f"batch_{kind}.npz"), **batch_np)
        step, tx, _ = ts.jit_step(kind, cfg, params, mesh, kl_coef=0.05,
                                  seq_len=t)
        state, _ = context.create_state(cfg, mesh, params, tx)
        batch = mesh_lib.put_batch(batch_np, mesh)
        holder = {"state": state}
        losses = []

        def run():
          holder["state"], metrics = step(holder["state"], batch)
          losses.append(context.host_scalars(metrics)["loss"])

        first, _ = _median_seconds(run, 1)
        _median_seconds(run, 1)
        seconds, times = _median_seconds(run, z["train_repeats"])
        if remat == z["remats"][0]:
          s.put(**{f"profile_{kind}": device_profile(run)})
        holder.clear()  # Frees the state before the next compile.
        state = None
        tok_s = b * t / seconds
        row = {"step": kind, "remat": remat, "seconds": seconds,
               "times_s": times, "first_call_s": first, "tokens_per_s": tok_s,
               "losses": losses, "losses_finite": bool(np.isfinite(
                   losses).all())}
        for convention in ("causal", "noncausal"):
          if peak:
            row[f"mfu_{convention}"] = ts.mfu(tok_s, flops[convention], peak)
          row[f"mfu_{convention}_datasheet"] = ts.mfu(
              tok_s, flops[convention], DATASHEET_BF16_TFLOPS)
        rows.append(row)
        s.put(rows=rows, flops_per_token=flops)
      del params


def section_train_torch(s: Section):
  """transformers + torch on the checkpoint and batches `train` wrote."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top

  z = s.sizes
  ours = s.read("train")
  device = "cuda" if torch.cuda.is_available() else "cpu"
  s.put(torch=torch.__version__, transformers=transformers.__version__,
        device=device,
        gpu=torch.cuda.get_device_name() if device == "cuda" else None)
  rows = []
  b, t = z["train_batch"], z["train_len"]
  for kind in ("sft", "policy"):
    # Each step kind starts from the checkpoint, as ours does.
    model = transformers.Qwen2ForCausalLM.from_pretrained(
        ours["checkpoint"], dtype=torch.float32,
        attn_implementation="sdpa").to(device)
    model.train()
    host = dict(np.load(os.path.join(s.workdir, f"batch_{kind}.npz")))
    step = ts.TorchStep(model, kind, ts.optimizer_settings(kind),
                        ts.policy_settings(0.05), device, "bfloat16")
    step.batch = {k: torch.tensor(v, device=device).long()
                  if v.dtype.kind == "i" else torch.tensor(v, device=device)
                  for k, v in host.items()}
    checkpointing = False
    losses = []

    def run():
      losses.append(float(step(step.batch)["loss"]))

    try:
      first, _ = _median_seconds(run, 1)
    except torch.cuda.OutOfMemoryError:
      # The activations of a step without recomputation do not fit.
      step.opt.zero_grad(set_to_none=True)
      torch.cuda.empty_cache()
      model.gradient_checkpointing_enable()
      checkpointing = True
      first, _ = _median_seconds(run, 1)
    _median_seconds(run, 1)
    seconds, times = _median_seconds(run, z["train_repeats"])
    row = {"step": kind, "seconds": seconds, "times_s": times,
           "first_call_s": first, "tokens_per_s": b * t / seconds,
           "losses": losses, "gradient_checkpointing": checkpointing,
           "fused_adamw": step.fused}
    if device == "cuda":
      row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    ours_rows = [r for r in ours.get("rows", ()) if r["step"] == kind]
    for r in ours_rows:
      row[f"ours_over_torch_remat_{r['remat']}"] = (r["tokens_per_s"] /
                                                    row["tokens_per_s"])
      row[f"first_loss_rel_diff_remat_{r['remat']}"] = (
          abs(r["losses"][0] - losses[0]) / max(abs(losses[0]), 1e-12))
    step.batch = step.model = model = None
    if device == "cuda":
      torch.cuda.empty_cache()
    rows.append(row)
    s.put(rows=rows)


def section_sample(s: Section, batches=None):
  """Our sampler: tokens/s and memory-bandwidth utilisation, and a kernel
  profile of one call at each batch size (`batches`, default all)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.rollout import sampler  # pylint: disable=g-import-not-at-top

  z = s.sizes
  bandwidth = s.read("probe").get("copy_gb_s")
  cfg, params = models.load_hf(ensure_checkpoint(s), dtype="bfloat16")
  params = jax.tree.map(lambda x: x.astype("bfloat16"), params)
  weight_bytes = models.num_params(cfg) * 2
  s.put(model=z["model"] or "toy", weight_bytes=weight_bytes,
        measured_copy_gb_s=bandwidth, prompt_len=z["prompt_len"],
        new_tokens=z["new_tokens"], **_device_info())
  rows = []
  for batch in batches or z["sample_batches"]:
    prompts, mask = left_padded_prompts(batch, z["prompt_len"],
                                        cfg.vocab_size, seed=batch)
    calls = [0]

    def run():
      calls[0] += 1
      out = sampler.sample(cfg, params, prompts, mask,
                           jax.random.key(calls[0]),
                           max_new_tokens=z["new_tokens"], temperature=1.0,
                           top_p=1.0, eos_id=None, pad_id=0)
      jax.block_until_ready(out.tokens)

    first, _ = _median_seconds(run, 1)
    seconds, times = _median_seconds(run, z["sample_repeats"])
    s.put(**{f"profile_batch_{batch}": device_profile(run)})
    moved = decode_bytes(cfg, mask, z["new_tokens"], weight_bytes)
    row = {"batch": batch, "seconds": seconds, "times_s": times,
           "first_call_s": first,
           "tokens_per_s": batch * z["new_tokens"] / seconds, **moved,
           "achieved_gb_s": moved["total_bytes"] / seconds / 1e9}
    if bandwidth:
      row["mbu"] = row["achieved_gb_s"] / bandwidth
    rows.append(row)
    s.put(rows=rows)


def section_sample_cublas(s: Section):
  """`sample` at the first batch size, run with `SECTION_ENV`'s flags."""
  s.put(xla_flags=os.environ.get("XLA_FLAGS", ""))
  section_sample(s, s.sizes["sample_batches"][:1])


def section_sample_hf(s: Section):
  """transformers `generate` on the same weights and prompts."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  z = s.sizes
  ckpt = ensure_checkpoint(s)
  ours = {r["batch"]: r for r in s.read("sample").get("rows", ())}
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
  model.eval()
  s.put(device=device, torch=torch.__version__,
        transformers=transformers.__version__)
  rows = []
  for batch in z["sample_batches"]:
    # The prompts of `sample` (same function, same seed).
    tokens, mask = left_padded_prompts(batch, z["prompt_len"],
                                       model.config.vocab_size, seed=batch)
    ids = torch.tensor(tokens, device=device).long()
    mask = torch.tensor(mask, device=device).long()

    def run(new_tokens):
      with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                       eos_token_id=None, pad_token_id=0, use_cache=True)
      if device == "cuda":
        torch.cuda.synchronize()

    run(4)  # Warm-up: kernels and allocator.
    seconds, times = _median_seconds(lambda: run(z["new_tokens"]), 1)
    row = {"batch": batch, "seconds": seconds, "times_s": times,
           "tokens_per_s": batch * z["new_tokens"] / seconds}
    if batch in ours:
      row["ours_over_hf"] = ours[batch]["tokens_per_s"] / row["tokens_per_s"]
    rows.append(row)
    s.put(rows=rows)
