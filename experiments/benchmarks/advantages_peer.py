"""Peer side of the advantage benchmark: verl's estimators on saved inputs.

Runs in a virtual environment with torch and verl (not a dependency of this
project), started by `advantages.py`. It reads the inputs that script wrote,
runs each estimator once and writes the outputs (so both sides are compared
on identical arrays), prints a ready line, then serves timing requests from
standard input so that the two sides can be timed in alternating windows
under the same machine load:

  request  (stdin):  "<estimator> <min calls> <min seconds>" or "quit"
  response (stdout): "@@ {"estimator": ..., "ms": <median>, "calls": n}"

  python advantages_peer.py --inputs in.npz --outputs out.npz
"""

import argparse
import json
import statistics
import sys
import time
import types

import numpy as np
import torch
import verl
from verl.trainer.ppo import core_algos


def _median_ms(fn, repeats, min_seconds):
  """Median of >= `repeats` calls over >= `min_seconds` (already warm)."""
  times = []
  begin = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - begin < min_seconds:
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times), len(times)


def _pure_strict_min_form(token_rewards, mask):
  """PURE's token-level strict min-form: a Python loop over positions."""
  returns = token_rewards * mask
  for c in reversed(range(returns.shape[1] - 1)):
    returns[:, c] = torch.minimum(returns[:, c], returns[:, c + 1])
  return returns * mask


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--inputs", required=True)
  parser.add_argument("--outputs", required=True)
  args = parser.parse_args()

  data = np.load(args.inputs)
  rewards = torch.from_numpy(data["rewards"])
  values = torch.from_numpy(data["values"])
  mask = torch.from_numpy(data["mask"])
  outcome_rewards = torch.from_numpy(data["outcome_rewards"])
  rpp_rewards = torch.from_numpy(data["rpp_rewards"])
  step_end_rewards = torch.from_numpy(data["step_end_rewards"])
  index = data["index"]
  gamma = float(data["gamma"])
  lam = float(data["lam"])
  rpp_config = types.SimpleNamespace(gamma=float(data["rpp_gamma"]))

  calls = {
      "gae": lambda: core_algos.compute_gae_advantage_return(
          rewards, values, mask, gamma=gamma, lam=lam),
      "grpo": lambda: core_algos.compute_grpo_outcome_advantage(
          outcome_rewards, mask, index),
      "rloo": lambda: core_algos.compute_rloo_outcome_advantage(
          outcome_rewards, mask, index),
      "reinforce_plus_plus": lambda: (
          core_algos.compute_reinforce_plus_plus_outcome_advantage(
              rpp_rewards, mask, config=rpp_config)),
      "min_form": lambda: _pure_strict_min_form(step_end_rewards, mask),
  }
  torch.set_grad_enabled(False)
  outputs = {}
  for name, call in calls.items():
    result = call()
    if isinstance(result, tuple):
      outputs[name + "/advantages"] = result[0].numpy()
      outputs[name + "/returns"] = result[1].numpy()
    else:
      outputs[name + "/returns"] = result.numpy()
  np.savez(args.outputs, **outputs)
  _reply({"ready": True, "torch": torch.__version__,
          "verl": getattr(verl, "__version__", "unknown"),
          "torch_threads": torch.get_num_threads()})
  for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
      break
    name, repeats, min_seconds = words[0], int(words[1]), float(words[2])
    ms, count = _median_ms(calls[name], repeats, min_seconds)
    _reply({"estimator": name, "ms": ms, "calls": count})


def _reply(message):
  print("@@ " + json.dumps(message), flush=True)


if __name__ == "__main__":
  main()
