"""The multi-turn throughput benchmark: its table, and a run at test size."""

import json
import os
import subprocess
import sys

import pytest

from experiments.benchmarks import results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_table_rows_from_hand_made_results():
  row = {"size": "tiny", "params": 400_512, "batch": 64, "prompt_len": 24,
         "episode_tokens": 96, "mean_turns": 5.25,
         "episode_decode_steps": 130,
         "single_tokens_per_s": 6000.0, "episode_tokens_per_s": 4500.4,
         "policy_tokens_per_s": 3000.0, "ratio": 0.75}
  table = results.episodes_table({"rows": [row]}).split("\n")
  assert len(table) == 3
  assert table[2] == ("| tiny (0.4 M) | 64 | 24 + 96 | 5.2 | 130 / 96 | "
                      "6,000 | 4,500 | 3,000 | 0.75× |")


@pytest.mark.slow  # A subprocess that compiles both sides: ~25 s.
def test_a_run_writes_results_that_render(tmp_path):
  out = tmp_path / "episodes.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.episodes",
       "--model_size=test", "--batches=4", "--episode_tokens=24",
       "--turn_tokens=6", "--prompt_len=24", "--repeats=1", f"--out={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  data = json.loads(out.read_text())
  [row] = data["rows"]
  assert (row["size"], row["batch"], row["episode_tokens"]) == ("test", 4, 24)
  # The single-turn side generates every slot; episodes fill at most them.
  assert row["single_tokens_per_s"] * row["single_s"] == pytest.approx(96)
  assert 0 < row["filled"] <= 1 and row["mean_turns"] >= 2
  assert row["policy_tokens_per_s"] < row["episode_tokens_per_s"]
  # Each turn decodes until its batch's longest turn ends: at least the
  # policy tokens of the mean episode, at most 6 per turn of the longest.
  mean_policy = row["policy_tokens_per_s"] * row["episodes_s"] / 4
  assert mean_policy <= row["episode_decode_steps"] <= 6 * 24
  assert row["ratio"] == (row["episode_tokens_per_s"] /
                          row["single_tokens_per_s"])
  assert data["provenance"]["command"].startswith(
      "python -m experiments.benchmarks.episodes")
  assert results.episodes_table(data).count("\n") == 2
