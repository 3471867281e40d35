r"""Where a step's milliseconds go: ours beside PyTorch's, by kind of work.

For each configuration (the CPU default job's shapes on the `tiny` model and
the benchmarks' 42 M `small` model), one call of each side runs under its
profiler after a warm-up, and its time is split into the same five kinds:

  dense matmuls   projections, MLP and LM head (forward and backward)
  attention       scores, mask, softmax, weighted sum, RoPE (matmuls too)
  copies          copies and transposes of whole arrays
  optimizer       AdamW, gradient clipping, the non-finite guard
  other           norms, activations, residuals, loss, sampling, the rest

Ours: the events of XLA's CPU thunks (`jax.profiler`), each op named in the
compiled HLO and classified by its kind and the source op it came from.
PyTorch's: the self CPU time of each aten op (`torch.profiler`; autograd's
`...Backward` nodes add their children's matmuls). Each side's shares are
scaled to its median un-profiled time of the step (`--repeats` calls,
alternating the sides), so a row sums to that time.

  SFT and policy steps: `train_step`'s steps (as the runners jit them) and
  its PyTorch step on the same safetensors weights and batch;
  decode: `rollout.sampler.sample` and transformers `generate`, sampled at
  temperature 1, no early stop; ms per generated token position (one
  decoding step of the whole batch).

  pip install torch==2.13.0 'transformers>=4.50,<5.11'
  python -m experiments.benchmarks.step_profile --out=docs/results/step_profile.json

CPU only: on a GPU the thunk events and their names differ.
"""

import collections
import glob
import json
import os
import statistics
import tempfile
import time
from unittest import mock

from absl import app
from absl import flags

from experiments.benchmarks import results as results_lib
from experiments.benchmarks import train_step

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON results.",
                           allow_override=True)
_CONFIGS = flags.DEFINE_list(
    "configs", ["tiny_sft", "tiny_policy", "tiny_decode", "small_sft",
                "small_policy", "small_decode"], "Configurations to profile.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per side.",
                                allow_override=True)

KINDS = results_lib.PROFILE_KINDS

# name -> (model preset, vocabulary, step, batch, T or new tokens)
CONFIGS = {
    "tiny_sft": ("tiny", 18, "sft", 64, 96),
    "tiny_policy": ("tiny", 18, "policy", 256, 96),
    "tiny_decode": ("tiny", 18, "decode", 256, 72),
    "small_sft": ("small", 1024, "sft", 8, 256),
    "small_policy": ("small", 1024, "policy", 8, 256),
    "small_decode": ("small", 1024, "decode", 64, 256),
}
_PROMPT_LEN = 24
_ATTENTION_MATMULS = ("bjq", "BNTS", "BTNH", "BSNH")


def hlo_ops(hlo_text: str) -> dict:
  """{op name: (HLO opcode, source op_name metadata)} of a compiled module."""
  import re  # pylint: disable=g-import-not-at-top
  ops = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = \S+ ([\w\-]+)\(", line)
    if m:
      source = re.search(r'op_name="([^"]*)"', line)
      ops[m.group(1)] = (m.group(2), source.group(1) if source else "")
  return ops


def our_kind(name: str, opcode: str, source: str) -> str:
  """The kind of work of one of our compiled ops (see the module doc)."""
  matmul = name.startswith(("ynn_fusion", "dot")) or opcode == "dot"
  attention = "/attention/" in source
  if matmul and not (attention and any(s in source
                                       for s in _ATTENTION_MATMULS)):
    return "attention" if attention and "reduce" in source else (
        "dense matmuls")
  if "copy" in name or "transpose" in name:
    return "copies"
  if attention:
    return "attention"
  if (source.startswith("jit(update_step)/") and "jvp(" not in source):
    return "optimizer"
  return "other"


def torch_kind(op: str) -> str:
  """The kind of work of a PyTorch profiler event (an aten op)."""
  low = op.lower()
  if low in ("aten::mm", "aten::addmm"):
    return "dense matmuls"
  if any(s in low for s in ("bmm", "softmax", "scaled_dot_product",
                            "attention", "rotary")):
    return "attention"
  if low in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat",
             "aten::index_select", "aten::_to_copy"):
    return "copies"
  if any(s in low for s in ("adam", "_foreach", "clip_grad", "optimizer")):
    return "optimizer"
  return "other"


def _scaled(split: dict, total_ms: float) -> dict:
  whole = sum(split.values()) or 1.0
  return {k: total_ms * split.get(k, 0.0) / whole for k in KINDS}


def _profile_ours(call, hlo_text: str) -> dict:
  """{kind: profiled ms} of one `call()` under `jax.profiler`."""
  import jax  # pylint: disable=g-import-not-at-top
  ops = hlo_ops(hlo_text)
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir):
      call()
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                     recursive=True)[0]
    profile = jax.profiler.ProfileData.from_file(path)
  split = collections.Counter()
  for plane in profile.planes:
    for line in plane.lines:
      for event in line.events:
        if event.name in ops:
          split[our_kind(event.name, *ops[event.name])] += (
              event.duration_ns / 1e6)
  return split


def _profile_torch(call) -> dict:
  """{kind: self CPU ms} of one `call()` under `torch.profiler`."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.profiler.profile(
      activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    call()
  split = collections.Counter()
  for event in prof.key_averages():
    split[torch_kind(event.key)] += event.self_cpu_time_total / 1e3
  return split


def _training_sides(model, vocab, kind, batch, seq_len, workdir):
  """(our call, our HLO text, torch call) for an SFT or policy step."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import context  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  cfg = train_step.model_config(model, vocab, "float32", seq_len)
  path = os.path.join(workdir, f"{model}_{vocab}")
  if not os.path.exists(path):
    models.save_hf(path, cfg, models.init_params(cfg, jax.random.key(0)))
  cfg, params = models.load_hf(path, dtype="float32")
  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1},
                            jax.devices()[:1])
  host = train_step.step_batch(kind, cfg, params, batch, seq_len)
  with mesh_lib.activate(mesh):
    step, tx, _ = train_step.jit_step(kind, cfg, params, mesh, kl_coef=0.05,
                                      seq_len=seq_len)
    state, _ = context.create_state(cfg, mesh, params, tx)
    data = mesh_lib.put_batch(host, mesh)
    hlo = step.lower(state, data).compile().as_text()
  holder = {"state": state}

  def ours():
    with mesh_lib.activate(mesh):
      holder["state"], metrics = step(holder["state"], data)
      jax.block_until_ready(metrics)

  options = {"torch_device": "cpu", "kl_coef": 0.05, "dtype": "float32"}
  torch_step = train_step._make_torch_step(kind, path, host, options)  # pylint: disable=protected-access
  return ours, hlo, lambda: torch_step(torch_step.batch)


def _decode_sides(model, vocab, batch, new_tokens, workdir):
  """(our call, our HLO text, torch call) for sampling `new_tokens`."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.rollout import sampler  # pylint: disable=g-import-not-at-top

  cfg = models.preset(model, vocab).replace(
      max_position_embeddings=_PROMPT_LEN + new_tokens)
  path = os.path.join(workdir, f"{model}_{vocab}_decode")
  models.save_hf(path, cfg, models.init_params(cfg, jax.random.key(0)))
  cfg, params = models.load_hf(path, dtype="float32")
  rs = np.random.RandomState(batch)
  prompts = rs.randint(1, vocab, (batch, _PROMPT_LEN)).astype(np.int32)
  mask = np.ones_like(prompts)
  captured = {}
  real = sampler._jit_sample  # pylint: disable=protected-access

  def capture(*args, **kwargs):
    captured.setdefault("call", (args, kwargs))
    return real(*args, **kwargs)

  def ours():
    out = sampler.sample(cfg, params, prompts, mask, jax.random.key(1),
                         max_new_tokens=new_tokens, temperature=1.0,
                         eos_id=None, pad_id=0)
    jax.block_until_ready(out.tokens)

  with mock.patch.object(sampler, "_jit_sample", capture):
    ours()
  args, kwargs = captured["call"]
  hlo = real.lower(*args, **kwargs).compile().as_text()
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()

  def theirs():
    with torch.inference_mode():
      hf.generate(input_ids=torch.tensor(prompts, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long),
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                  eos_token_id=None, pad_token_id=0, use_cache=True)
  return ours, hlo, theirs


def profile_config(name: str, workdir: str, repeats: int) -> dict:
  """Times and profiles both sides of one configuration; returns a row."""
  import torch  # pylint: disable=g-import-not-at-top
  model, vocab, kind, batch, length = CONFIGS[name]
  torch.set_num_threads(os.cpu_count() or 1)
  if kind == "decode":
    ours, hlo, theirs = _decode_sides(model, vocab, batch, length, workdir)
    per = length  # ms per decoding step of the batch
  else:
    ours, hlo, theirs = _training_sides(model, vocab, kind, batch, length,
                                        workdir)
    per = 1
  ours(), theirs(), ours(), theirs()  # Warm-up (our compile).
  times = {"ours": [], "torch": []}
  for _ in range(repeats):
    for side, call in (("ours", ours), ("torch", theirs)):
      start = time.perf_counter()
      call()
      times[side].append(time.perf_counter() - start)
  medians = {s: statistics.median(t) * 1e3 / per for s, t in times.items()}
  return {
      "config": name, "model": model, "step": kind, "batch": batch,
      "length": length, "ours_ms": medians["ours"],
      "torch_ms": medians["torch"], "torch_threads": torch.get_num_threads(),
      "ours_kinds_ms": _scaled(_profile_ours(ours, hlo), medians["ours"]),
      "torch_kinds_ms": _scaled(_profile_torch(theirs), medians["torch"]),
      "times_s": times,
  }


def main(argv):
  del argv
  for name in _CONFIGS.value:
    if name not in CONFIGS:
      raise SystemExit(f"--configs: unknown {name!r}; expected some of "
                       f"{sorted(CONFIGS)}.")
  start = results_lib.started()
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    for name in _CONFIGS.value:
      rows.append(profile_config(name, workdir, _REPEATS.value))
      print(json.dumps({k: v for k, v in rows[-1].items() if k != "times_s"}),
            flush=True)
  data = {"rows": rows}
  print(results_lib.step_profile_table(data))
  if _OUT.value:
    results_lib.write(_OUT.value, data, start)


if __name__ == "__main__":
  app.run(main)
