r"""Sampler throughput: our jitted KV-cache sampler vs transformers `generate`.

Both sides use the same weights (one safetensors checkpoint written by
`save_hf` and read by `load_hf` and by `AutoModelForCausalLM`), the same
left-padded prompts, float32, and no early stop (no EOS), so every call
generates exactly batch x new_tokens tokens. Each configuration runs one
warm-up call of ours (its compile time is reported separately) and one of
transformers per PyTorch thread count (1 and all cores; the faster count is
kept, see --torch_threads), then `--repeats` timed calls, alternating the two
sides so that machine noise hits both; reported times are medians. Greedy
outputs of the two sides are compared token by token, and the run exits
non-zero when they differ (`--min_greedy_agreement`).

Needs PyTorch and transformers next to this package (they are not project
dependencies):

  pip install torch==2.13.0 'transformers>=4.50,<5.11'
  python -m experiments.benchmarks.sampler --out=/tmp/sampler.json

The "dense floor" column is the time the model's dense matmuls alone take for
the same work (the prefill's projections and MLPs on B x P tokens, then
G - 1 single-token steps, each streaming every weight matrix, and the LM head
on each new token), run by the same XLA backend: no attention, no cache, no
sampling. `ours / floor` near 1 means the sampler is bound by matmul compute
and weight reads, not by its own overhead.

The last table row is the CPU default job's rollout shape: the `tiny` model,
vocabulary 18, 256 sequences x 72 new tokens at temperature 1.
"""

import json
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

from experiments.benchmarks import results

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON results.", allow_override=True)
_SIZES = flags.DEFINE_list("sizes", ["tiny", "small"], "Model presets.")
_BATCHES = flags.DEFINE_list("batches", ["8", "64"], "Batch sizes.")
_NEW_TOKENS = flags.DEFINE_list("new_tokens", ["64", "256"],
                                "Generated tokens per sequence.")
_MODES = flags.DEFINE_list("modes", ["greedy", "sampled"],
                           "greedy (temperature 0) and/or sampled (T = 1).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 24, "Prompt slots.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per side.", allow_override=True)
_TINY_VOCAB = flags.DEFINE_integer("tiny_vocab_size", 18,
                                   "Vocabulary of the tiny model.")
_SMALL_VOCAB = flags.DEFINE_integer("small_vocab_size", 1024,
                                    "Vocabulary of the small model.")
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads", 0,
    "PyTorch intra-op threads; 0 = time one warm-up call with 1 thread and "
    "one with all cores for each configuration and keep the faster (on a "
    "busy machine OpenMP spinning can make all cores many times slower).", allow_override=True)
_SEGMENTED_MIN_TOKENS = flags.DEFINE_integer(
    "segmented_min_tokens", None,
    "Overrides sampler.SEGMENTED_DECODE_MIN_TOKENS (decoding in segments with "
    "a growing cache from this many new tokens on); a huge value decodes in "
    "one segment with the full cache.")
_DEFAULT_JOB = flags.DEFINE_bool(
    "default_job", True, "Also time tiny, B=256, 72 new tokens, sampled.")
_MIN_GREEDY_AGREEMENT = flags.DEFINE_float(
    "min_greedy_agreement", 1.0,
    "Fraction of generated greedy tokens that must equal transformers'; the "
    "benchmark exits non-zero below it.")

_PAD = 0


def _prompts(batch, prompt_len, vocab_size, seed):
  """Random left-padded prompts: 0..prompt_len/3 pads per row."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  tokens = rs.randint(1, vocab_size, (batch, prompt_len))
  pads = rs.randint(0, prompt_len // 3 + 1, batch)
  mask = (np.arange(prompt_len)[None] >= pads[:, None]).astype(np.int64)
  return np.where(mask == 1, tokens, _PAD), mask


def greedy_agreement(ours_tokens, hf_tokens, prompt_len) -> float:
  """Fraction of generated tokens ([B, P + G] each, after the P prompt
  slots) on which the two sides' greedy outputs are equal."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  ours = np.asarray(ours_tokens)[:, prompt_len:]
  theirs = np.asarray(hf_tokens)[:, prompt_len:]
  if ours.shape != theirs.shape:
    return 0.0
  return float(np.mean(ours == theirs))


def check_greedy_agreement(rows, minimum):
  """Exits non-zero (`SystemExit`) naming every greedy row whose token
  agreement with transformers is below `minimum`."""
  bad = [f"{r['size']} B={r['batch']} G={r['new_tokens']}: "
         f"{r['greedy_token_agreement']:.4f}" for r in rows
         if r.get("greedy_token_agreement", 1.0) < minimum]
  if bad:
    raise SystemExit(f"Greedy outputs differ from transformers' (agreement "
                     f"below {minimum}): " + "; ".join(bad))


def _median_time(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def dense_floor_fn(cfg, batch, prompt_len, new_tokens):
  """A jitted fn(params) -> array doing only the decoder's dense matmuls.

  Prefill: every layer's q/k/v/o projections and MLP on [B * P, D]; then
  G - 1 decode steps on [B, D] in a loop (each step reads every weight
  matrix again, as a real decode step does), each ending in the LM head.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  d = cfg.hidden_size

  def layers(params, x):
    for i in range(cfg.num_layers):
      attention = params[f"layers_{i}"]["attention"]
      mlp = params[f"layers_{i}"]["mlp"]
      q, k, v = (x @ attention[f"{n}_kernel"].reshape(d, -1)
                 for n in ("q", "k", "v"))
      mixed = q + jnp.tile(k + v, (1, q.shape[1] // k.shape[1]))
      x = x + mixed @ attention["o_kernel"].reshape(-1, d)
      hidden = jax.nn.silu(x @ mlp["gate_kernel"]) * (x @ mlp["up_kernel"])
      x = x + hidden @ mlp["down_kernel"]
      x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
    return x

  def head(params, x):
    if cfg.tie_word_embeddings:
      return x @ params["embed"].T
    return x @ params["lm_head"]

  @jax.jit
  def run(params):
    x = layers(params, jnp.ones((batch * prompt_len, d), jnp.float32))
    x = x.reshape(batch, prompt_len, d)[:, -1]
    def step(_, x):
      logits = head(params, x)
      return layers(params, x + logits[:, :1] * 1e-6)
    return jax.lax.fori_loop(0, new_tokens - 1, step, x)
  return run


def _bench_config(ours, hf, size, batch, new_tokens, mode, vocab_size,
                  repeats):
  """Times one configuration on both sides; returns a result dict."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from rl_rewards.rollout import sampler  # pylint: disable=g-import-not-at-top

  cfg, params = ours
  prompts, mask = _prompts(batch, _PROMPT_LEN.value, vocab_size, seed=batch)
  greedy = mode == "greedy"
  calls = [0]

  def run_ours():
    calls[0] += 1
    out = sampler.sample(
        cfg, params, prompts.astype(np.int32), mask, jax.random.key(calls[0]),
        max_new_tokens=new_tokens, temperature=0.0 if greedy else 1.0,
        top_p=1.0, eos_id=None, pad_id=_PAD)
    return jax.block_until_ready(out.tokens)

  def run_hf():
    sampling = {} if greedy else dict(temperature=1.0, top_p=1.0, top_k=0)
    with torch.inference_mode():
      return hf.generate(
          input_ids=torch.tensor(prompts), attention_mask=torch.tensor(mask),
          max_new_tokens=new_tokens, min_new_tokens=new_tokens,
          do_sample=not greedy, eos_token_id=None, pad_token_id=_PAD,
          use_cache=True, **sampling).numpy()

  floor = dense_floor_fn(cfg, batch, _PROMPT_LEN.value, new_tokens)
  run_floor = lambda: jax.block_until_ready(floor(params))
  run_floor()
  start = time.perf_counter()
  ours_tokens = np.asarray(run_ours())
  compile_s = time.perf_counter() - start
  # Warm-up calls of HF, one per thread count; the faster count is kept.
  candidates = ([_TORCH_THREADS.value] if _TORCH_THREADS.value
                else sorted({1, os.cpu_count() or 1}))
  warmup = []
  for threads in candidates:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    hf_tokens = run_hf()
    warmup.append((time.perf_counter() - start, threads))
  torch.set_num_threads(min(warmup)[1])
  ours_times, hf_times, floor_times = [], [], []
  for _ in range(repeats):  # Alternate the sides.
    ours_times.append(_median_time(run_ours, 1))
    floor_times.append(_median_time(run_floor, 1))
    hf_times.append(_median_time(run_hf, 1))
  generated = batch * new_tokens
  row = {
      "size": size, "batch": batch, "new_tokens": new_tokens, "mode": mode,
      "vocab_size": vocab_size,
      "ours_s": statistics.median(ours_times),
      "hf_s": statistics.median(hf_times),
      "ours_first_call_s": compile_s,
      "dense_floor_s": statistics.median(floor_times),
      "torch_threads": torch.get_num_threads(),
  }
  row["ours_tok_s"] = generated / row["ours_s"]
  row["hf_tok_s"] = generated / row["hf_s"]
  row["ratio"] = row["ours_tok_s"] / row["hf_tok_s"]
  row["floor_tok_s"] = generated / row["dense_floor_s"]
  row["ours_over_floor"] = row["ours_s"] / row["dense_floor_s"]
  if greedy:
    row["greedy_token_agreement"] = greedy_agreement(
        ours_tokens, hf_tokens, _PROMPT_LEN.value)
  return row


def _load_both(size, vocab_size, workdir):
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top

  cfg = models.preset(size, vocab_size)
  path = os.path.join(workdir, size)
  models.save_hf(path, cfg, models.init_params(cfg, jax.random.key(0)))
  cfg, params = models.load_hf(path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32)
  hf.eval()
  return (cfg, params), hf, models.num_params(cfg)


def _print_table(rows):
  header = ("| size | params | batch | new | mode | ours tok/s | HF tok/s | "
            "ratio | dense floor tok/s | ours / floor | ours first call s | "
            "greedy agreement | torch threads |")
  print(header)
  print("|" + "---|" * 13)
  for r in rows:
    agreement = r.get("greedy_token_agreement")
    print(f"| {r['size']} | {r['params'] / 1e6:.2f} M | {r['batch']} | "
          f"{r['new_tokens']} | {r['mode']} | {r['ours_tok_s']:,.0f} | "
          f"{r['hf_tok_s']:,.0f} | {r['ratio']:.1f}x | "
          f"{r['floor_tok_s']:,.0f} | {r['ours_over_floor']:.2f} | "
          f"{r['ours_first_call_s']:.1f} | "
          f"{'-' if agreement is None else f'{agreement:.3f}'} | "
          f"{r['torch_threads']} |")


def main(argv):
  del argv
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise SystemExit(f"This benchmark needs torch and transformers ({e}); "
                     "see the module docstring.") from None
  if _SEGMENTED_MIN_TOKENS.value is not None:
    from rl_rewards.rollout import sampler  # pylint: disable=g-import-not-at-top
    sampler.SEGMENTED_DECODE_MIN_TOKENS = _SEGMENTED_MIN_TOKENS.value
  start = results.started()
  vocab = {"tiny": _TINY_VOCAB.value, "small": _SMALL_VOCAB.value}
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    plan = [(size, int(b), int(g), mode) for size in _SIZES.value
            for b in _BATCHES.value for g in _NEW_TOKENS.value
            for mode in _MODES.value]
    if _DEFAULT_JOB.value:
      plan.append(("tiny", 256, 72, "sampled"))
    loaded = {}
    for size, batch, new_tokens, mode in plan:
      if size not in loaded:
        loaded[size] = _load_both(size, vocab.get(size, 1024), workdir)
      ours, hf, num_params = loaded[size]
      row = _bench_config(ours, hf, size, batch, new_tokens, mode,
                          vocab.get(size, 1024), _REPEATS.value)
      row["params"] = num_params
      rows.append(row)
      print(json.dumps(row), flush=True)
  print(f"\ncpus: {os.cpu_count()}")
  _print_table(rows)
  if _OUT.value:
    results.write(_OUT.value, {"rows": rows, "cpu_count": os.cpu_count(),
                               "repeats": _REPEATS.value}, start)
  check_greedy_agreement(rows, _MIN_GREEDY_AGREEMENT.value)


if __name__ == "__main__":
  app.run(main)
