r"""The default job's updates and passes at several micro-batch sizes.

    python -m experiments.benchmarks.micro_batches \
        --out=docs/results/micro_batches.json

Times, in one process and alternating between the sizes, the three programs
whose rows `sft|rl|prm.micro_batch_size` split: the SFT step (64 × 96
slots), the policy update (256 × 96) and the log-probability pass over a
rollout (256 × 96), each built and jitted as the runners build them, on the
default job's model (`tiny`, vocabulary 18). A micro-batch size of 0 is the
whole batch at once. Every size computes the same update up to rounding; the
table gives the largest relative difference of the first step's loss (or of
the pass's log-probabilities) from the whole batch's. Medians over
`--calls` calls after two warm-up calls.
"""

import statistics
import time

from absl import app
from absl import flags

_OUT = flags.DEFINE_string("out", None, "Results JSON (optional).",
                           allow_override=True)
_ROUNDS = flags.DEFINE_integer("calls", 10, "Timed calls per size.")
_SIZES = flags.DEFINE_list("micro_batch_sizes", ["0", "32", "16", "8"],
                           "Rows per micro-batch (0: the whole batch).")
_SFT_BATCH = flags.DEFINE_integer("sft_batch", 64, "SFT rows.")
_RL_BATCH = flags.DEFINE_integer("rl_batch", 256, "Policy-update rows.")
# The default job's model and slots per row.
MODEL, VOCAB_SIZE, SEQ_LEN = "tiny", 18, 96

PROGRAMS = ("sft step", "policy update", "log-prob pass")


def _programs(cfg, params, sizes, sft_batch, rl_batch, seq_len):
  """{(program, size): call}: each call runs the program once (a step keeps
  its own state) and returns what is compared (the loss, or log-probs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import context  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from rl_rewards.train import steps  # pylint: disable=g-import-not-at-top

  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1},
                            jax.devices()[:1])
  calls = {}
  for program, kind, rows in (("sft step", "sft", sft_batch),
                              ("policy update", "policy", rl_batch)):
    host = ts.step_batch(kind, cfg, params, rows, seq_len)
    for size in sizes:
      with mesh_lib.activate(mesh):
        step, tx, _ = ts.jit_step(kind, cfg, params, mesh, kl_coef=0.001,
                                  seq_len=seq_len, micro_batch_size=size)
        state, _ = context.create_state(cfg, mesh, params, tx)
        batch = mesh_lib.put_batch(host, mesh)
      holder = {"state": state}

      def call(step=step, batch=batch, holder=holder):
        holder["state"], metrics = step(holder["state"], batch)
        return float(jax.block_until_ready(metrics)["loss"])
      calls[(program, size)] = call
  host = ts.make_batch(rl_batch, seq_len, cfg.vocab_size, seed=0)
  for size in sizes:
    fn = jax.jit(steps.make_logprob_fn(cfg, micro_batch_size=size,
                                       chunk_size=512))
    calls[("log-prob pass", size)] = (
        lambda fn=fn: np.asarray(jax.block_until_ready(
            fn(params, host["tokens"], host["attention_mask"]))))
  return calls


def _relative_difference(out, ref) -> float:
  import numpy as np  # pylint: disable=g-import-not-at-top
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))


def run(options: dict) -> dict:
  """Times every (program, size) alternating; returns the results."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top

  sizes = options["sizes"]
  cfg = models.preset(options["model"], options["vocab_size"]).replace(
      max_position_embeddings=max(512, options["seq_len"]))
  params = models.init_params(cfg, jax.random.key(0))
  calls = _programs(cfg, params, sizes, options["sft_batch"],
                    options["rl_batch"], options["seq_len"])
  first = {key: call() for key, call in calls.items()}  # Compiles.
  for call in calls.values():
    call()
  times = {key: [] for key in calls}
  for _ in range(options["rounds"]):
    for key, call in calls.items():
      start = time.perf_counter()
      call()
      times[key].append(time.perf_counter() - start)
  rows = []
  for program in PROGRAMS:
    whole = statistics.median(times[(program, sizes[0])])
    for size in sizes:
      median = statistics.median(times[(program, size)])
      rows.append({
          "program": program, "micro_batch_size": size,
          "median_ms": median * 1e3,
          "times_ms": [t * 1e3 for t in times[(program, size)]],
          "speedup": whole / median,
          "relative_difference": _relative_difference(
              first[(program, size)], first[(program, sizes[0])])})
  shapes = {"sft step": (options["sft_batch"], options["seq_len"]),
            "policy update": (options["rl_batch"], options["seq_len"]),
            "log-prob pass": (options["rl_batch"], options["seq_len"])}
  return {"model": options["model"], "vocab_size": options["vocab_size"],
          "params": models.num_params(cfg), "rounds": options["rounds"],
          "shapes": {k: list(v) for k, v in shapes.items()}, "rows": rows}


def main(argv):
  del argv
  from experiments.benchmarks import results  # pylint: disable=g-import-not-at-top
  try:
    sizes = [int(s) for s in _SIZES.value]
  except ValueError:
    raise SystemExit(f"--micro_batch_sizes: expected integers, got "
                     f"{','.join(_SIZES.value)!r}.") from None
  if not sizes or sizes[0] != 0 or min(sizes) < 0:
    raise SystemExit("--micro_batch_sizes: the first must be 0 (the whole "
                     "batch, the reference) and none negative.")
  start = results.started()
  data = run({"sizes": sizes, "rounds": _ROUNDS.value, "model": MODEL,
              "vocab_size": VOCAB_SIZE, "sft_batch": _SFT_BATCH.value,
              "rl_batch": _RL_BATCH.value, "seq_len": SEQ_LEN})
  for row in data["rows"]:
    print(f"{row['program']:14s} micro {row['micro_batch_size']:3d}: "
          f"{row['median_ms']:8.1f} ms  {row['speedup']:.2f}x  "
          f"rel. diff {row['relative_difference']:.1e}")
  if _OUT.value:
    results.write(_OUT.value, data, start)


if __name__ == "__main__":
  app.run(main)
