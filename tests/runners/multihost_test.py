"""Two processes on localhost run the pipeline exactly as one 8-device run.

The tests that launch the whole pipeline carry the `slow` mark (`pytest -m
slow`). The default suite launches one short real two-process run of the
reductions only (rollout metrics, greedy accuracy, pass@n; 2 processes x 2
CPU devices against 1 process x 4) and keeps the other metric reductions as
two simulated processes.
Each test launches `experiments/train.py` (through `multihost_worker.py`,
which records what each process does) as 2 processes x 4 CPU devices,
connected by `jax.distributed` (CPU collectives: gloo), and compares with a
single process on 8 devices running the same config in this test process:

* rows: every call that builds or scores rows sees, on each process, only
  that process's rows; over the processes they are exactly the rows of the
  single-process call, and a rollout is scored half on each process (a
  process building or scoring rows that are not its own fails this);
* metrics: every process computes identical metric records, equal to the
  single-process ones within float tolerance (cross-process all-reduces sum
  in another order); only process 0 writes the workdir files;
* parameters: the final parameters agree within float tolerance;
* resume (slow): a second launch extending the run restores the
  collectively written checkpoint and continues like the reference;
* the default job (slow): sft -> labels -> prm -> rl on two processes.
"""

import importlib.util
import math
import os
import socket
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages
from rl_rewards.runners import rl_metrics
from rl_rewards.runners import sft
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.sharding import mesh as mesh_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "multihost_worker.py")
NUM_PROCESSES, LOCAL_DEVICES = 2, 4
TIMEOUT_S = 900

_spec = importlib.util.spec_from_file_location("multihost_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

# The fast case: the oracle-PAV job at `test` size, shrunk to what every
# stage needs once: 1 SFT step, 2 RL steps (a checkpoint after each, PAV
# credit from oracle step labels), held-out greedy accuracy on 8 problems.
FAST = ("configs/oracle.py:size=test",
        {"sft.max_steps": 1, "sft.gate_every_steps": 2, "eval.pass_n": 1,
         "eval.size_per_k": 4, "eval.batch_size": 8,
         "rl.eval_every_steps": 2, "rl.steps": 2})
# The default job (PAV: sft -> labels -> prm -> rl) with gate evals and
# pass@2, at `test` size.
DEFAULT = ("configs/default.py:size=test", {"sft.max_steps": 2})


def _config(spec, overrides):
  config = cli.load_config_file(os.path.join(ROOT, spec))
  for key, value in overrides.items():
    node = config
    *parents, name = key.split(".")
    for parent in parents:
      node = node[parent]
    node[name] = value
  return config


def _flags(spec, overrides):
  return [f"--config={spec}"] + [f"--config.{k}={v}"
                                 for k, v in overrides.items()]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(workdir: str, spec: str, overrides: dict,
            tag: str) -> list[list[dict]]:
  """Runs train.py as NUM_PROCESSES processes; returns each one's records."""
  port = _free_port()
  cache = os.environ.get(
      "RL_REWARDS_TEST_JAX_CACHE",
      os.path.join(tempfile.gettempdir(), "rl_rewards_test_jax_cache"))
  procs, records, logs = [], [], []
  for i in range(NUM_PROCESSES):
    env = dict(os.environ)
    env.update({
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
        "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
        "JAX_NUM_PROCESSES": str(NUM_PROCESSES), "JAX_PROCESS_ID": str(i),
        "JAX_COMPILATION_CACHE_DIR": cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "PYTHONPATH": ROOT})
    record = f"{workdir}.{tag}.records{i}.jsonl"
    log = open(f"{workdir}.{tag}.log{i}.txt", "w")  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen(
        [sys.executable, WORKER, record, f"--workdir={workdir}",
         *_flags(spec, overrides)], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT))
    records.append(record)
    logs.append(log)
  try:
    codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for log in logs:
      log.close()
  if any(codes):
    tails = []
    for log in logs:
      with open(log.name) as f:
        tails.append(f"--- {log.name}\n" + "".join(f.readlines()[-30:]))
    pytest.fail(f"exit codes {codes}\n" + "\n".join(tails))
  return [worker.read(r) for r in records]


def _run_single(workdir: str, spec: str, overrides: dict,
                tag: str) -> list[dict]:
  """The reference: this process (8 devices), with the same recorder."""
  record = f"{workdir}.{tag}.records.jsonl"
  with pytest.MonkeyPatch.context() as patch:
    worker.install(record, patch.setattr)
    pipeline.run(_config(spec, overrides), workdir)
  return worker.read(record)


def _run_both(root, spec, overrides, tag="first"):
  reference_dir, workdir = str(root / "single"), str(root / "multi")
  single = _run_single(reference_dir, spec, overrides, tag)
  per_process = _launch(workdir, spec, overrides, tag)
  return workdir, per_process, reference_dir, single


def _is_deterministic(key: str) -> bool:
  """Metrics other than timings and workdir paths."""
  return not (key.startswith(("time/", "perf/")) or
              key in ("time", "labels/path") or
              key.endswith(("seconds", "_s")))


def _assert_close(got, want, where):
  if isinstance(want, float) and not isinstance(want, bool):
    assert isinstance(got, (int, float)), where
    if math.isnan(want):
      assert math.isnan(got), where
    else:
      assert got == pytest.approx(want, rel=1e-5, abs=1e-6), where
  else:
    assert got == want, where


def _metrics(records):
  return [(r["stage"], r["step"],
           {k: v for k, v in r["values"].items() if _is_deterministic(k)})
          for r in records if r["kind"] == "metrics"]


def _labelling(rows) -> bool:
  first = rows[0][1] if rows else -1
  return prm_stages.LABEL_INDEX_OFFSET <= first < sft.CONTINUE_INDEX_OFFSET


def _check_rows(per_process, single):
  """Each process built and scored its own rows, and together all rows.

  Calls run in the same order everywhere; the rows of one call, over the
  processes, are the rows of the single-process call (as a multiset: pass@n
  scores its batches at once, each process its own rows of every batch).
  The labelling stage is the exception: every process samples and labels
  every solution (identical records, written by process 0).
  """
  calls = [[r for r in records if r["kind"] != "metrics"]
           for records in per_process]
  reference = [r for r in single if r["kind"] != "metrics"]
  assert all(len(c) == len(reference) for c in calls), [len(c) for c in calls]
  rollout_rows = [0] * len(calls)
  for k, want in enumerate(reference):
    got = [c[k] for c in calls]
    assert all(g["kind"] == want["kind"] for g in got), (k, want["kind"])
    if _labelling(want["rows"]):
      assert all(g["rows"] == want["rows"] for g in got), k
      continue
    joined = [row for g in got for row in g["rows"]]
    assert sorted(joined) == sorted(want["rows"]), (k, want["kind"])
    if want["kind"] == "score" and want["rows"][0][1] >= (
        tasks_lib.RL_INDEX_OFFSET):
      # Rollout scoring: exactly half of the global batch on each process.
      for i, g in enumerate(got):
        assert len(g["rows"]) * NUM_PROCESSES == len(want["rows"])
        rollout_rows[i] += len(g["rows"])
  assert all(rollout_rows), rollout_rows


def _check_metrics(per_process, single, workdir, reference_dir):
  first = _metrics(per_process[0])
  for other in per_process[1:]:  # Every process logs identical numbers.
    assert _metrics(other) == first
  want = _metrics(single)
  assert [(s, t, sorted(v)) for s, t, v in first] == [
      (s, t, sorted(v)) for s, t, v in want]
  for (stage, step, got), (_, _, values) in zip(first, want):
    for key, value in values.items():
      _assert_close(got[key], value, f"{stage} step {step} {key}")
  # Only process 0 wrote metrics.jsonl: one line per record, not one per
  # process.
  assert len(metrics_lib.read_metrics(workdir)) == len(
      metrics_lib.read_metrics(reference_dir))
  summary = metrics_lib.read_json(os.path.join(workdir, "summary.json"))
  reference = metrics_lib.read_json(os.path.join(reference_dir,
                                                 "summary.json"))
  assert summary["stages"].keys() == reference["stages"].keys()
  for stage, values in reference["stages"].items():
    for key, value in values.items():
      if _is_deterministic(key):
        _assert_close(summary["stages"][stage][key], value, f"{stage} {key}")


def _check_params(workdir, reference_dir, stages=("sft", "rl")):
  for stage in stages:
    def state(directory, stage=stage):
      ckpt = checkpoints.Checkpointer(
          os.path.join(directory, "checkpoints", stage))
      restored = ckpt.restore_raw()
      ckpt.close()
      for name in ("policy", "prm"):  # States holding several models.
        restored = restored.get(name, restored)
      return restored
    got, want = state(workdir), state(reference_dir)
    assert int(got["step"]) == int(want["step"]) > 0
    got, want = jax.tree.leaves(got["params"]), jax.tree.leaves(
        want["params"])
    assert len(got) == len(want)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory):
  """(multi-process workdir, its records, reference workdir, its records)."""
  return _run_both(tmp_path_factory.mktemp("multihost"), *FAST)


@pytest.mark.slow
def test_each_process_builds_and_scores_only_its_rows(fast_runs):
  _, per_process, _, single = fast_runs
  _check_rows(per_process, single)
  kinds = {r["kind"] for r in single}
  assert {"encode_sft", "encode_prompts", "score", "metrics"} <= kinds


@pytest.mark.slow
def test_two_processes_log_and_train_like_one(fast_runs):
  workdir, per_process, reference_dir, single = fast_runs
  _check_metrics(per_process, single, workdir, reference_dir)
  _check_params(workdir, reference_dir)


@pytest.mark.slow
def test_resume_on_two_processes_matches_one(fast_runs):
  # Extends the finished run: a new launch restores the checkpoint the two
  # processes wrote together and runs one more RL step.
  workdir, _, reference_dir, _ = fast_runs
  spec, overrides = FAST
  extended = dict(overrides, **{"rl.steps": 3})
  single = _run_single(reference_dir, spec, extended, "resumed")
  per_process = _launch(workdir, spec, extended, "resumed")
  _check_rows(per_process, single)
  _check_metrics(per_process, single, workdir, reference_dir)
  _check_params(workdir, reference_dir)


@pytest.mark.slow
def test_default_job_on_two_processes_matches_one(tmp_path):
  workdir, per_process, reference_dir, single = _run_both(tmp_path, *DEFAULT)
  _check_rows(per_process, single)
  _check_metrics(per_process, single, workdir, reference_dir)
  _check_params(workdir, reference_dir, ("sft", "prm", "rl"))


# ------------------------- the reductions, on two real processes (fast) ---

REDUCTION_TIMEOUT_S = 240


def _launch_reductions(tmp_path):
  """Runs `multihost_worker.py --reductions` as 2 processes x 2 devices and
  as 1 process x 4 devices, all at once; returns (per process, single)."""
  port = _free_port()
  cache = os.environ.get(
      "RL_REWARDS_TEST_JAX_CACHE",
      os.path.join(tempfile.gettempdir(), "rl_rewards_test_jax_cache"))
  base = {k: v for k, v in os.environ.items()
          if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES",
                               "JAX_PROCESS_ID"))}
  base.update({"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT,
               "JAX_COMPILATION_CACHE_DIR": cache,
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
  launches = [("single", 4, {})] + [
      (f"multi{i}", 2, {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
                        "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)})
      for i in range(2)]
  procs = []
  for name, devices, extra in launches:
    env = dict(base, XLA_FLAGS=(
        f"--xla_force_host_platform_device_count={devices}"), **extra)
    log = open(tmp_path / f"{name}.log", "w")  # pylint: disable=consider-using-with
    procs.append((name, log, subprocess.Popen(
        [sys.executable, WORKER, "--reductions",
         str(tmp_path / f"{name}.json"), str(tmp_path / name)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)))
  try:
    codes = [p.wait(timeout=REDUCTION_TIMEOUT_S) for _, _, p in procs]
  except subprocess.TimeoutExpired:
    codes = None
  finally:
    for _, log, p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
      log.close()
  if codes is None or any(codes):
    tails = "\n".join(f"--- {name}\n" + "".join(
        open(tmp_path / f"{name}.log").readlines()[-20:])
                      for name, _, _ in procs)
    pytest.fail(f"exit codes {codes}\n{tails}")
  out = {name: metrics_lib.read_json(str(tmp_path / f"{name}.json"))
         for name, _, _ in procs}
  return [out["multi0"], out["multi1"]], out["single"]


def test_reductions_on_two_real_processes_equal_one(tmp_path):
  per_process, single = _launch_reductions(tmp_path)
  assert [(r["process"], r["processes"], r["devices"])
          for r in per_process] == [(0, 2, 4), (1, 2, 4)]
  assert (single["processes"], single["devices"]) == (1, 4)
  want = single["metrics"]
  # Something to reduce: the scorer marks about half of the rows correct.
  for key in ("step0/train/reward_mean", "step1/train/reward_mean",
              "eval/accuracy", "eval/mean@2"):
    assert 0 < want[key] < 1, key
  assert want["eval/pass@2"] > 0 and want["eval/mean_length"] > 0
  # Two rollouts, the greedy evaluation and pass@2: each process scored
  # exactly half of the rows of each call.
  assert single["rows"] == [8, 8, 8, 16]
  for got in per_process:
    assert got["rows"] == [n // 2 for n in single["rows"]]
  # Every process reports the same numbers, those of the single process.
  assert per_process[0]["metrics"] == per_process[1]["metrics"]
  got = per_process[0]["metrics"]
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


# ------------------------------------------- row blocks, in one process ---


def _host_of(device):
  """Pretends devices 0-3 are one host's and 4-7 another's."""
  return device.id // LOCAL_DEVICES


def _mesh(data, fsdp=1, tensor=1, order=None):
  devices = jax.devices()
  if order is not None:
    devices = [devices[i] for i in order]
  return mesh_lib.make_mesh({"data": data, "fsdp": fsdp, "tensor": tensor},
                            devices)


@pytest.mark.parametrize("sizes", [(8, 1, 1), (2, 2, 2), (1, 4, 2)])
def test_each_host_holds_one_contiguous_half(sizes):
  mesh = _mesh(*sizes)
  ways = mesh_lib.batch_axis_size(mesh)
  for batch in (ways, 4 * ways):
    blocks = mesh_lib.process_row_blocks(batch, mesh,
                                         device_process=_host_of)
    assert blocks == {0: (0, batch // 2), 1: (batch // 2, batch)}


def test_rows_shared_by_hosts_are_refused():
  # The tensor axis across hosts: every host would hold every row.
  with pytest.raises(ValueError, match="several processes hold the same"):
    mesh_lib.process_row_blocks(8, _mesh(1, 1, 8), device_process=_host_of)
  with pytest.raises(ValueError, match="several processes hold the same"):
    mesh_lib.process_row_blocks(
        8, _mesh(4, 1, 2), device_process=lambda d: d.id % 2)


def test_interleaved_hosts_are_refused():
  mesh = _mesh(8, order=(0, 4, 1, 5, 2, 6, 3, 7))
  with pytest.raises(ValueError, match="not one contiguous block"):
    mesh_lib.process_row_blocks(16, mesh, device_process=_host_of)


def test_batch_not_dividing_the_mesh_is_refused():
  with pytest.raises(ValueError, match="not divisible by the 8-way"):
    mesh_lib.process_rows(12, _mesh(8))


def test_local_batch_round_trip_in_one_process():
  mesh = _mesh(4, 1, 2)
  x = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
  assert mesh_lib.process_rows(8, mesh) == slice(0, 8)
  placed = mesh_lib.put_local_batch({"x": x}, mesh, 8)["x"]
  assert placed.sharding.is_equivalent_to(mesh_lib.batch_sharding(mesh), 2)
  np.testing.assert_array_equal(mesh_lib.local_rows(placed, mesh), x)
  with pytest.raises(ValueError, match="got 4 rows"):
    mesh_lib.put_local_batch(x[:4], mesh, 8)


@pytest.mark.parametrize("spec", [jax.sharding.PartitionSpec(),
                                  jax.sharding.PartitionSpec(None, "tensor"),
                                  jax.sharding.PartitionSpec(("data", "fsdp"),
                                                             "tensor")])
def test_local_rows_reassembles_any_covering_sharding(spec):
  mesh = _mesh(4, 1, 2)
  x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
  placed = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
  np.testing.assert_array_equal(mesh_lib.local_rows(placed, mesh), x)


def test_process_sums_in_one_process_are_the_sums():
  assert mesh_lib.process_sums({"a": np.int32(3), "b": 0.25}) == {
      "a": 3.0, "b": 0.25}


# ------------------------------- metrics from per-process sums and counts ---


def _as_processes(monkeypatch, fn, parts):
  """Runs `fn(*part)` as if each part were one process's rows.

  A first pass records each part's sums; then `process_sums` returns their
  totals, as the all-gather does. Returns every "process"'s result.
  """
  sums = []

  def record(values):
    sums.append(dict(values))
    return {k: float(v) for k, v in values.items()}
  monkeypatch.setattr(mesh_lib, "process_sums", record)
  for part in parts:
    fn(*part)
  monkeypatch.setattr(mesh_lib, "process_sums", lambda values: {
      k: float(sum(s[k] for s in sums)) for k in values})
  return [fn(*part) for part in parts]


def _scored(rows):
  rewards = np.array([1, 0, 1, 1, 0, 0, 0, 1], np.float32)
  labels = [[True, True, True], [True, False], [True] * 4, [False], [],
            [True, True], [False, True, True], [True, True, True]]
  return tasks_lib.Scored(
      rewards=rewards[rows],
      num_steps=np.array([len(l) for l in labels], np.int32)[rows],
      first_error=np.full((8,), -1, np.int32)[rows],
      empty_steps=np.array([0, 1, 0, 0, 0, 1, 0, 0], np.int32)[rows],
      step_labels=labels[rows])


def test_rollout_metrics_from_two_processes_equal_one(monkeypatch):
  lengths = np.array([10, 7, 12, 5, 3, 8, 9, 11], np.int32)
  whole = rl_metrics.rollout_metrics(_scored(slice(None)), lengths, 2)
  # Hand-computed: groups (1,0) (1,1) (0,0) (0,1); 18 steps, 2 empty.
  assert whole["train/reward_mean"] == 0.5
  assert whole["train/mixed_groups"] == 0.5
  assert whole["train/response_length"] == 65 / 8
  assert whole["train/steps_per_response"] == 18 / 8
  assert whole["train/tokens_per_step"] == pytest.approx(np.mean(
      lengths / np.array([3, 2, 4, 1, 1, 2, 3, 3])))
  assert whole["train/empty_step_fraction"] == 2 / 18
  assert whole["train/all_steps_correct"] == 4 / 8  # Rows 0, 2, 5, 7.
  assert whole["train/correct_with_wrong_step"] == 1 / 8  # Row 3.
  halves = [(_scored(rows), lengths[rows], 2)
            for rows in (slice(0, 4), slice(4, 8))]
  for got in _as_processes(monkeypatch, rl_metrics.rollout_metrics, halves):
    assert got.keys() == whole.keys()
    for key, value in whole.items():
      assert got[key] == pytest.approx(value, rel=1e-12), key


def test_prm_agreement_from_two_processes_equals_one(monkeypatch):
  rng = np.random.default_rng(0)
  scores = rng.random((8, 4)).astype(np.float32)
  step_ids = np.full((8, 10), -1, np.int32)
  for b, n in enumerate([3, 2, 4, 1, 1, 2, 3, 4]):
    step_ids[b, 2:2 + 2 * n] = np.repeat(np.arange(n), 2)
  oracle = (rng.random((8, 4)) > 0.5).astype(np.float32)
  rewards = np.array([1, 0, 1, 1, 0, 0, 0, 1], np.float32)
  whole = rl_metrics.prm_agreement_metrics(scores, step_ids, oracle, rewards)
  valid = np.arange(4)[None, :] < np.array([3, 2, 4, 1, 1, 2, 3, 4])[:, None]
  assert whole["prm/mean_step_score"] == pytest.approx(scores[valid].mean())
  assert whole["prm/step_label_agreement"] == pytest.approx(np.mean(
      ((scores >= 0.5) == (oracle >= 0.5))[valid]))
  parts = [(scores[r], step_ids[r], oracle[r], rewards[r])
           for r in (slice(0, 2), slice(2, 8))]
  for got in _as_processes(monkeypatch, rl_metrics.prm_agreement_metrics,
                           parts):
    for key, value in whole.items():
      assert got[key] == pytest.approx(value, rel=1e-12), key
