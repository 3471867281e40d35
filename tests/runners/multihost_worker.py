"""One process of a multi-process run, launched by `multihost_test.py`.

    python tests/runners/multihost_worker.py RECORD_FILE [train.py flags...]
    python tests/runners/multihost_worker.py --reductions OUT_JSON WORKDIR

The first form runs `experiments/train.py` exactly as a user would (the
launch is set up by the environment: `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`, and the device count in `XLA_FLAGS`),
and records in RECORD_FILE, one JSON line per call, which problems this
process encoded and scored and which metrics it computed. The test runs the
single-process reference with the same recorder (`install`).

The second form (`reductions`) runs only what combines rows over processes,
on a randomly initialised `test`-size policy: two RL rollouts and their
metrics (`rl_metrics.rollout_metrics`), the held-out greedy accuracy
(`evaluation.greedy_accuracy`) and pass@n (`evaluation.pass_at_n`), with a
scorer that marks about half of the responses correct (`mixed_scores`), and
writes the numbers and the rows this process scored to OUT_JSON.
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


# The `test`-size oracle job, shrunk to one compile of each sampler shape:
# rollouts of 4 prompts x 2 samples (pass@2 reuses the shape), greedy
# evaluation of 8 problems (4 per number of operations) in one batch.
REDUCTION_OVERRIDES = {"rl.prompts_per_step": 4, "rl.group_size": 2,
                       "rl.minibatches": 1, "eval.pass_n": 2,
                       "eval.size_per_k": 4, "eval.batch_size": 8}


def mixed_scores(setattr_fn=setattr):
  """Scores a response correct when its text length plus its problem index
  is odd (or when it is right): about half of the rows, a function of each
  row's own text, so every reduction carries a signal."""
  score = tasks_lib.ArithTask.score

  def mixed(self, problems, texts, finished):
    import dataclasses  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    scored = score(self, problems, texts, finished)
    odd = np.array([(len(t) + p.index) % 2 for p, t in zip(problems, texts)],
                   np.float32)
    return dataclasses.replace(
        scored, rewards=np.maximum(np.asarray(scored.rewards), odd))

  setattr_fn(tasks_lib.ArithTask, "score", mixed)


def run_reductions(out_path: str, workdir: str):
  """Writes {metrics: {name: value}, rows: [[kind, rows scored]]}."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import cli  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import context as context_lib  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import evaluation  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import pipeline  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import rl  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import rl_metrics  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  mesh_lib.maybe_initialize_distributed()
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "oracle.py") + ":size=test")
  for key, value in REDUCTION_OVERRIDES.items():
    section, name = key.split(".")
    config[section][name] = value
  mixed_scores()
  rows = []
  score = tasks_lib.ArithTask.score

  def counted(self, problems, texts, finished):
    rows.append(len(texts))
    return score(self, problems, texts, finished)

  tasks_lib.ArithTask.score = counted
  ctx = pipeline.build_context(config, workdir)
  params = context_lib.place_params(ctx, models.init_params(
      ctx.model_config, jax.random.key(1)))
  metrics = {}
  for step in range(2):
    _, scored, info = rl.rollout(ctx, params, step)
    step_metrics = rl_metrics.rollout_metrics(scored, info["lengths"],
                                              config.rl.group_size)
    metrics.update({f"step{step}/{k}": v for k, v in step_metrics.items()})
    metrics[f"step{step}/num_tokens"] = info["num_tokens"]
  problems = ctx.task.problems_per_k("eval", config.eval.size_per_k)
  metrics.update(evaluation.greedy_accuracy(
      ctx, params, problems, batch_size=config.eval.batch_size,
      rng=ctx.rng("eval", 0)))
  metrics.update(evaluation.pass_at_n(
      ctx, params, problems, n=config.eval.pass_n,
      prompts_per_batch=config.rl.prompts_per_step,
      rng=ctx.rng("eval", 1)))
  with open(out_path, "w") as f:
    json.dump({"metrics": metrics, "rows": rows,
               "process": jax.process_index(),
               "processes": jax.process_count(),
               "devices": jax.device_count()}, f)


if __name__ == "__main__":
  if sys.argv[1] == "--reductions":
    run_reductions(sys.argv[2], sys.argv[3])
    sys.exit(0)
  from experiments import train  # pylint: disable=g-import-not-at-top
  from rl_rewards import cli  # pylint: disable=g-import-not-at-top
  install(sys.argv[1])
  sys.argv = [sys.argv[0]] + sys.argv[2:]
  cli.run(train.main)
