r"""Advantage estimators: rl_rewards.core side by side with verl on one CPU.

Both sides get the same random inputs (batch x length, right-padded, random
lengths): this script writes them to a temporary .npz and starts verl's side
in a subprocess with the peer interpreter (`advantages_peer.py`), which runs
each estimator once on them and writes its outputs. Agreement is checked on
valid tokens after the same whitening. Timing alternates between the sides:
for each of --rounds rounds and each estimator, the peer times a window of
at least --repeats calls over at least --min_seconds, then we time the same
window for our `jax.jit` function (compile excluded). Reported times are the
medians over rounds of the per-window medians, and the speed-up is the
median of the per-round ratios, so that both sides are measured under the
same load of a shared machine. Our time is also shown next to a
memory-bandwidth bound: the bytes the estimator must read and write divided
by a measured DRAM copy bandwidth (arrays this size partly fit in the
last-level cache, so a ratio near or below 1 is possible).

Rows: verl `compute_gae_advantage_return` (GAE + whitening),
`compute_grpo_outcome_advantage`, `compute_rloo_outcome_advantage`,
`compute_reinforce_plus_plus_outcome_advantage`, and PURE's token-level
strict min-form (a Python loop over positions, as in PURE's code) against
`token_min_form_returns`.

The peer environment is not a dependency of this project; see
docs/performance.md for how to create it. Usage:

  python -m experiments.benchmarks.advantages \
      --peer_python=/work/verl-venv/bin/python --out=/tmp/advantages.json
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import results as results_lib
import rl_rewards.core as rc

_BATCH = flags.DEFINE_integer("batch", 1024, "Number of responses B.", allow_override=True)
_LENGTH = flags.DEFINE_integer("length", 2048, "Padded response length T.")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 8, "Samples per prompt.")
_REPEATS = flags.DEFINE_integer("repeats", 5,
                                "Minimum timed calls per window.", allow_override=True)
_MIN_SECONDS = flags.DEFINE_float(
    "min_seconds", 1.0, "Minimum wall-clock length of a timing window.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Alternating timing windows per estimator and side.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs.", allow_override=True)
_GAMMA = flags.DEFINE_float("gamma", 0.99, "GAE discount.")
_LAM = flags.DEFINE_float("lam", 0.95, "GAE lambda.")
_TOLERANCE = flags.DEFINE_float("tolerance", 1e-4,
                                "Max abs difference allowed after whitening.", allow_override=True)
_PEER_PYTHON = flags.DEFINE_string(
    "peer_python", None, "Python of a virtual environment with verl; "
    "without it only our side is timed.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.", allow_override=True)

_PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "advantages_peer.py")


def make_inputs(batch, length, group_size, seed):
  """Random right-padded batch with outcome, dense and step-end rewards."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, length + 1, size=batch)
  lengths[0] = length  # A truncated response.
  positions = np.arange(length)[None, :]
  mask = (positions < lengths[:, None]).astype(np.float32)
  is_last = positions == (lengths - 1)[:, None]
  outcome = rng.integers(0, 2, size=batch).astype(np.float32)
  outcome_rewards = np.where(is_last, outcome[:, None], 0).astype(np.float32)
  kl = 0.01 * rng.standard_normal((batch, length)).astype(np.float32)
  rpp_rewards = ((outcome_rewards - kl) * mask).astype(np.float32)
  step_ends = (rng.random((batch, length)) < 0.05) | is_last
  step_end_rewards = np.where(
      step_ends & (mask > 0), rng.uniform(-1, 1, (batch, length)),
      0).astype(np.float32)
  return dict(
      rewards=rng.standard_normal((batch, length)).astype(np.float32) * mask,
      values=rng.standard_normal((batch, length)).astype(np.float32),
      mask=mask, outcome_rewards=outcome_rewards, rpp_rewards=rpp_rewards,
      step_end_rewards=step_end_rewards,
      index=np.arange(batch) // group_size,
      gamma=np.float32(_GAMMA.value), lam=np.float32(_LAM.value),
      rpp_gamma=np.float32(1.0))


def our_estimators(group_size, gamma, lam):
  """Jitted functions with verl's inputs and outputs."""

  def gae(rewards, values, mask):
    advantages, returns = rc.gae(rewards, values, mask, gamma=gamma, lam=lam)
    return rc.masked_whiten(advantages, mask), returns

  def group(estimator):
    def fn(token_rewards, mask):
      scores = jnp.sum(token_rewards, axis=1)
      advantages = rc.group_advantages(scores, group_size,
                                       estimator=estimator)
      return rc.broadcast_to_tokens(advantages, mask)
    return fn

  def reinforce_plus_plus(token_rewards, mask):
    return rc.reinforce_plus_plus(token_rewards, mask, gamma=1.0)

  return {
      "gae": (jax.jit(gae), ("rewards", "values", "mask")),
      "grpo": (jax.jit(group("grpo")), ("outcome_rewards", "mask")),
      "rloo": (jax.jit(group("rloo")), ("outcome_rewards", "mask")),
      "reinforce_plus_plus": (jax.jit(reinforce_plus_plus),
                              ("rpp_rewards", "mask")),
      "min_form": (jax.jit(rc.token_min_form_returns),
                   ("step_end_rewards", "mask")),
  }


# Bytes each estimator must read and write at least (float32 [B, T] arrays):
# inputs + outputs.
_ARRAYS_MOVED = {"gae": 3 + 2, "grpo": 2 + 1, "rloo": 2 + 1,
                 "reinforce_plus_plus": 2 + 2, "min_form": 2 + 1}


def median_ms(fn, args, repeats, min_seconds):
  """Median of >= `repeats` calls over >= `min_seconds` of a warm function.

  A fixed wall-clock window makes a fast function as exposed to the noise
  of a shared machine as a slow one.
  """
  times = []
  begin = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - begin < min_seconds:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def copy_bandwidth_gbs(repeats, num_bytes=256 << 20):
  """Read + write DRAM bandwidth of an in-place elementwise pass.

  The buffer (256 MiB) is far larger than the CPU's last-level cache, and
  the pass updates a donated buffer, so no fresh pages are faulted in.
  """
  fn = jax.jit(lambda v: v * 1.0001, donate_argnums=0)
  x = fn(jnp.ones((num_bytes // 4096, 1024), jnp.float32))
  times = []
  for _ in range(max(repeats, 5)):
    start = time.perf_counter()
    x = fn(x)
    x.block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * num_bytes / statistics.median(times) / 1e9


class Peer:
  """verl's side in a subprocess, answering timing requests on a pipe."""

  def __init__(self, peer_python, inputs, workdir):
    inputs_path = os.path.join(workdir, "inputs.npz")
    outputs_path = os.path.join(workdir, "peer_outputs.npz")
    np.savez(inputs_path, **inputs)
    self._process = subprocess.Popen(
        [peer_python, _PEER_SCRIPT, "--inputs", inputs_path, "--outputs",
         outputs_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    self.info = self._read()
    self.outputs = dict(np.load(outputs_path))

  def _read(self):
    for line in self._process.stdout:
      if line.startswith("@@ "):
        return json.loads(line[3:])
    raise RuntimeError("The peer process ended without answering; see its "
                       "error output above.")

  def time_ms(self, name, repeats, min_seconds):
    self._process.stdin.write(f"{name} {repeats} {min_seconds}\n")
    self._process.stdin.flush()
    return self._read()["ms"]

  def close(self):
    self._process.stdin.write("quit\n")
    self._process.stdin.close()
    self._process.wait(timeout=60)


def max_valid_difference(ours, theirs, mask):
  """max |ours − theirs| over the valid tokens (mask > 0); NaN if any is."""
  valid = mask > 0
  return float(np.max(np.abs(np.asarray(ours)[valid] - theirs[valid]),
                      initial=0.0))


def compare_with_peer(name, ours, peer_outputs, mask, tolerance):
  """Agreement of one estimator's outputs with the peer's, on valid tokens.

  Args:
    name: the estimator (a key of `our_estimators`).
    ours: tuple of our outputs, [B, T] each (GAE: advantages, returns).
    peer_outputs: the peer's arrays by "<name>/advantages" or
      "<name>/returns" (and "gae/returns").
    mask: [B, T] valid tokens.
    tolerance: the largest absolute difference that agrees.

  Returns:
    dict with `max_abs_diff` (and `max_abs_diff_returns` for GAE) and
    `agrees`: every difference <= tolerance (a NaN disagrees).
  """
  key = "/advantages" if name + "/advantages" in peer_outputs else "/returns"
  row = {"max_abs_diff": max_valid_difference(
      ours[0], peer_outputs[name + key], mask)}
  if name == "gae":
    row["max_abs_diff_returns"] = max_valid_difference(
        ours[1], peer_outputs["gae/returns"], mask)
  diffs = [v for k, v in row.items() if k.startswith("max_abs_diff")]
  row["agrees"] = all(d <= tolerance for d in diffs)
  return row


def check_agreement(rows):
  """Exits non-zero (`SystemExit`) naming every estimator that disagrees."""
  bad = [row["estimator"] for row in rows if not row.get("agrees", True)]
  if bad:
    sys.exit(f"Disagreement with verl above tolerance: {', '.join(bad)}.")


def main(argv):
  del argv
  start = results_lib.started()
  batch, length = _BATCH.value, _LENGTH.value
  repeats, window = _REPEATS.value, _MIN_SECONDS.value
  inputs = make_inputs(batch, length, _GROUP_SIZE.value, _SEED.value)
  with tempfile.TemporaryDirectory() as workdir:
    peer = (Peer(_PEER_PYTHON.value, inputs, workdir) if _PEER_PYTHON.value
            else None)
    try:
      rows = measure(inputs, peer, repeats, window)
    finally:
      if peer is not None:
        peer.close()
  bandwidth = copy_bandwidth_gbs(repeats)
  array_bytes = batch * length * 4
  for row in rows:
    row["bound_ms"] = (_ARRAYS_MOVED[row["estimator"]] * array_bytes
                       / (bandwidth * 1e9) * 1e3)

  print(f"\nbatch {batch} x length {length}, group size {_GROUP_SIZE.value}, "
        f"GAE gamma {_GAMMA.value} lam {_LAM.value}; {jax.devices()[0]}; "
        f"copy bandwidth {bandwidth:.1f} GB/s; {_ROUNDS.value} rounds of "
        f"alternating windows (>= {repeats} calls, >= {window:g} s)")
  if peer is not None:
    print(f"peer: verl {peer.info['verl']}, torch {peer.info['torch']} "
          f"({peer.info['torch_threads']} threads)")
  print()
  print("| estimator | verl (ms) | ours (ms) | speed-up | bandwidth bound "
        "(ms) | ours / bound | max abs diff |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for row in rows:
    verl_ms = f"{row['verl_ms']:.1f}" if "verl_ms" in row else "-"
    speedup = f"{row['speedup']:.1f}x" if "speedup" in row else "-"
    diff = f"{row['max_abs_diff']:.1e}" if "max_abs_diff" in row else "-"
    print(f"| {row['estimator']} | {verl_ms} | {row['ours_ms']:.2f} | "
          f"{speedup} | {row['bound_ms']:.2f} | "
          f"{row['ours_ms'] / row['bound_ms']:.1f} | {diff} |")
  if _OUT.value:
    results_lib.write(_OUT.value, dict(
        batch=batch, length=length, group_size=_GROUP_SIZE.value,
        gamma=_GAMMA.value, lam=_LAM.value, rounds=_ROUNDS.value,
        repeats=repeats, min_seconds=window, copy_bandwidth_gbs=bandwidth,
        device=str(jax.devices()[0]),
        peer=peer.info if peer is not None else None, rows=rows), start)
  check_agreement(rows)


def measure(inputs, peer, repeats, window):
  """Checks agreement, then times both sides in alternating windows."""
  device_inputs = {k: jnp.asarray(v) for k, v in inputs.items()
                   if k not in ("index", "gamma", "lam", "rpp_gamma")}
  estimators = our_estimators(_GROUP_SIZE.value, _GAMMA.value, _LAM.value)
  rows = []
  for name, (fn, keys) in estimators.items():
    args = [device_inputs[k] for k in keys]
    out = jax.block_until_ready(fn(*args))  # Compile and warm up.
    row = dict(estimator=name)
    if peer is not None:
      out = out if isinstance(out, tuple) else (out,)
      row.update(compare_with_peer(name, out, peer.outputs, inputs["mask"],
                                   _TOLERANCE.value))
    ours, theirs = [], []
    for _ in range(_ROUNDS.value):
      if peer is not None:
        theirs.append(peer.time_ms(name, repeats, window))
      ours.append(median_ms(fn, args, repeats, window))
    row["ours_ms"] = statistics.median(ours)
    row["ours_ms_rounds"] = ours
    if theirs:
      row["verl_ms"] = statistics.median(theirs)
      row["verl_ms_rounds"] = theirs
      row["speedup"] = statistics.median(
          [t / o for t, o in zip(theirs, ours)])
    rows.append(row)
  return rows


if __name__ == "__main__":
  app.run(main)
