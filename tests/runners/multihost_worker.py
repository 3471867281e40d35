"""One process of a multi-process run, launched by `multihost_test.py`.

    python tests/runners/multihost_worker.py RECORD_FILE [train.py flags...]

Runs `experiments/train.py` exactly as a user would (the launch is set up by
the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID`, and the device count in `XLA_FLAGS`), and records in
RECORD_FILE, one JSON line per call, which problems this process encoded and
scored and which metrics it computed. The test runs the single-process
reference with the same recorder (`install`).
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from rl_rewards import metrics as metrics_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from rl_rewards.runners import tasks as tasks_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def install(path: str, setattr_fn=setattr):
  """Records the rows every task call sees and every metric record.

  Args:
    path: the JSONL file to append to.
    setattr_fn: how to patch (`monkeypatch.setattr` in a test process).
  """
  log = open(path, "a")  # pylint: disable=consider-using-with

  def record(entry):
    log.write(json.dumps(entry, default=metrics_lib._to_json_value) + "\n")  # pylint: disable=protected-access
    log.flush()

  task_cls = tasks_lib.ArithTask
  encode_prompts, encode_sft, score = (task_cls.encode_prompts,
                                       task_cls.encode_sft, task_cls.score)

  def rows(problems):
    return [[p.split, p.index, p.question] for p in problems]

  def encode_prompts_logged(self, problems):
    record({"kind": "encode_prompts", "rows": rows(problems)})
    return encode_prompts(self, problems)

  def encode_sft_logged(self, problems):
    record({"kind": "encode_sft", "rows": rows(problems)})
    return encode_sft(self, problems)

  def score_logged(self, problems, texts, finished):
    record({"kind": "score", "rows": rows(problems)})
    return score(self, problems, texts, finished)

  write = metrics_lib.MetricsWriter.write

  def write_logged(self, stage, step, values):
    record({"kind": "metrics", "stage": stage, "step": int(step),
            "values": values})
    return write(self, stage, step, values)

  setattr_fn(task_cls, "encode_prompts", encode_prompts_logged)
  setattr_fn(task_cls, "encode_sft", encode_sft_logged)
  setattr_fn(task_cls, "score", score_logged)
  setattr_fn(metrics_lib.MetricsWriter, "write", write_logged)


def read(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
  from experiments import train  # pylint: disable=g-import-not-at-top
  from rl_rewards import cli  # pylint: disable=g-import-not-at-top
  install(sys.argv[1])
  sys.argv = [sys.argv[0]] + sys.argv[2:]
  cli.run(train.main)
