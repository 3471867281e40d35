"""experiments/benchmarks/micro_batches.py at toy sizes."""

from experiments.benchmarks import micro_batches
from experiments.benchmarks import results


def test_every_program_and_size_is_timed_and_agrees_with_the_whole_batch():
  data = micro_batches.run({"sizes": [0, 4], "rounds": 1, "model": "test",
                            "vocab_size": 18, "sft_batch": 8, "rl_batch": 8,
                            "seq_len": 16})
  rows = data["rows"]
  assert [(r["program"], r["micro_batch_size"]) for r in rows] == [
      (p, m) for p in micro_batches.PROGRAMS for m in (0, 4)]
  for r in rows:
    assert r["median_ms"] > 0 and len(r["times_ms"]) == 1
    # The same update (or log-probabilities) up to float32 rounding.
    assert r["relative_difference"] < 1e-4, r
  assert all(r["speedup"] == 1.0 for r in rows if r["micro_batch_size"] == 0)
  table = results.micro_batches_table(data)
  assert table.count("\n") == 2 + len(rows) - 1
