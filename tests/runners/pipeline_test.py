"""End-to-end runs of the pipeline at `test` size: workdir contract, resume."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import pipeline
from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards.rollout import sampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _load_config(spec: str):
  path, _, arg = spec.partition(":")
  return cli.load_config_file(os.path.join(ROOT, path) + (
      f":{arg}" if arg else ""))


def _final_params(workdir: str, stage: str):
  """The parameters of a stage's latest checkpoint, as numpy arrays."""
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", stage))
  restored = ckpt.restore_raw()
  ckpt.close()
  if "policy" in restored:  # RL states hold the policy next to other models.
    restored = restored["policy"]
  return restored["params"]


def _config(**overrides):
  config = _load_config("configs/default.py:size=test")
  config.rl.steps = 4
  config.rl.checkpoint_every_steps = 2
  config.sft.checkpoint_every_steps = 2
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def _greedy_metrics_by_hand(ctx, params):
  """The greedy evaluation of `params`, averaged here over every held-out
  problem: accuracy, mean length, truncated fraction, steps per response,
  step accuracy and accuracy per number of operations."""
  task, config = ctx.task, ctx.config
  problems = task.problems_per_k("eval", config.eval.size_per_k)
  size = config.eval.batch_size
  rewards, lengths, truncated, scored_rows = [], [], [], []
  for start in range(0, len(problems), size):
    chunk = problems[start:start + size]
    padded = chunk + [chunk[0]] * (size - len(chunk))
    tokens, mask = task.encode_prompts(padded)
    out = sampler.sample(
        ctx.model_config, params, tokens, mask, jax.random.key(0),
        max_new_tokens=task.max_new_tokens, temperature=0.0, top_p=1.0,
        eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id,
        delimiter_mask=task.delimiter_mask())
    real = slice(0, len(chunk))
    texts = task.decode_responses(np.asarray(out.tokens)[real],
                                  np.asarray(out.response_mask)[real])
    done = ~np.asarray(out.truncated)[real]
    scored = task.score(chunk, texts, done)
    rewards.extend(scored.rewards)
    lengths.extend(np.asarray(out.lengths)[real])
    truncated.extend(~done)
    scored_rows.extend(zip(scored.num_steps, scored.step_labels))
  rewards = np.asarray(rewards, np.float64)
  ks = np.array([p.num_ops for p in problems])
  out = {"eval/accuracy": rewards.mean(),
         "eval/mean_length": np.mean(lengths),
         "eval/truncated": np.mean(truncated),
         "eval/steps_per_response": np.mean([n for n, _ in scored_rows]),
         "eval/all_steps_correct": np.mean(
             [len(l) > 0 and all(l) for _, l in scored_rows]),
         "eval/step_accuracy": np.mean(
             [np.mean(l) if l else 0.0 for _, l in scored_rows])}
  for k in np.unique(ks):
    out[f"eval/accuracy_k{k}"] = rewards[ks == k].mean()
  assert 0 < out["eval/mean_length"]  # Something to compare.
  return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  summary = pipeline.run(_config(), workdir)
  return workdir, summary


def test_workdir_contract(uninterrupted, tmp_path):
  workdir, summary = uninterrupted
  for name in ("config.json", "metrics.jsonl", "summary.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "sft"))
  on_disk = metrics_lib.read_json(os.path.join(workdir, "summary.json"))
  # The default job is the PAV pipeline.
  assert set(on_disk["stages"]) == {"sft", "labels", "prm", "rl"}
  assert os.path.exists(os.path.join(workdir, "labels", "manifest.json"))
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "prm"))
  # The held-out numbers of each stage are those of its final parameters,
  # decoded and scored again here.
  ctx = pipeline.build_context(_config(), str(tmp_path / "recheck"))
  for stage in ("sft", "rl"):
    want = _greedy_metrics_by_hand(ctx, _final_params(workdir, stage))
    got = on_disk["stages"][stage]
    for key, value in want.items():
      assert got[key] == pytest.approx(value, abs=1e-9), (stage, key)
  assert on_disk["wall_time_s"] > 0
  assert summary["stages"]["rl"]["rl/steps"] == 4
  records = metrics_lib.read_metrics(workdir)
  rl_steps = sorted({r["step"] for r in records
                     if r["stage"] == "rl" and "train/loss" in r})
  assert rl_steps == [1, 2, 3, 4]
  for r in records:
    if r["stage"] == "rl" and "train/loss" in r:
      for key in ("train/reward_mean", "perf/tokens_per_sec", "time/update_s"):
        assert key in r, key
  config = json.load(open(os.path.join(workdir, "config.json")))
  assert config["rl"]["steps"] == 4


def test_rerun_reuses_finished_stages(uninterrupted):
  workdir, summary = uninterrupted
  again = pipeline.run(_config(), workdir)
  assert again["stages"] == json.loads(json.dumps(summary["stages"]))


class _Crash(Exception):
  pass


def _crash_when(monkeypatch, stage, step):
  original = metrics_lib.MetricsWriter.write

  def write(self, s, st, values):
    if s == stage and st == step and "train/loss" in values:
      raise _Crash(f"simulated kill at {stage} step {step}")
    return original(self, s, st, values)

  monkeypatch.setattr(metrics_lib.MetricsWriter, "write", write)


def _train_records(workdir):
  out = {}
  for r in metrics_lib.read_metrics(workdir):
    if "train/loss" in r:
      out[(r["stage"], r["step"])] = {
          k: v for k, v in r.items()
          if k.startswith("train/") or k.startswith("eval/")}
  return out


@pytest.mark.parametrize("stage,step", [("sft", 3), ("rl", 3)])
def test_resume_after_kill_is_exact(uninterrupted, tmp_path, monkeypatch,
                                    stage, step):
  reference_dir, _ = uninterrupted
  workdir = str(tmp_path / "interrupted")
  with monkeypatch.context() as patch:
    _crash_when(patch, stage, step)
    with pytest.raises(_Crash):
      pipeline.run(_config(), workdir)
  assert not os.path.exists(os.path.join(workdir, "summary.json"))
  pipeline.run(_config(), workdir)

  assert _train_records(workdir) == _train_records(reference_dir)
  ref = _final_params(reference_dir, "rl")
  got = _final_params(workdir, "rl")
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)


def test_extending_a_finished_run_continues_it(uninterrupted, tmp_path):
  workdir = str(tmp_path / "extended")
  pipeline.run(_config(**{"rl.steps": 2}), workdir)
  summary = pipeline.run(_config(), workdir)
  assert summary["stages"]["rl"]["rl/steps"] == 4
  reference_dir, _ = uninterrupted
  ref = _final_params(reference_dir, "rl")
  got = _final_params(workdir, "rl")
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)


def test_extending_a_run_of_several_updates_a_step_resumes_at_its_step(
    uninterrupted, tmp_path):
  # Two minibatches: the policy's update counter runs at twice the RL step,
  # so resuming must read the checkpoint's RL step, not the counter (which
  # would skip the extension's rollouts).
  reference_dir, _ = uninterrupted

  def config(steps):
    c = _config(**{"rl.steps": steps, "rl.minibatches": 2,
                   "sft.init_from": reference_dir,
                   "labels.init_from": reference_dir,
                   "prm.init_from": reference_dir})
    c.stages = "rl"
    return c

  workdir = str(tmp_path / "minibatches")
  pipeline.run(config(1), workdir)
  summary = pipeline.run(config(2), workdir)
  assert summary["stages"]["rl"]["rl/steps"] == 2
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  trained = [r["step"] for r in records
             if r["stage"] == "rl" and "train/reward_mean" in r]
  assert trained == [1, 2]


def test_a_label_budget_trains_on_the_first_problems(uninterrupted, tmp_path):
  reference_dir, summary = uninterrupted
  all_problems = summary["stages"]["prm"]["prm/label_problems"]
  assert all_problems == _config().labels.num_problems

  def budget(problems, name):
    config = _config(**{"prm.label_problems": problems,
                        "sft.init_from": reference_dir,
                        "labels.init_from": reference_dir})
    config.stages = "sft,prm"
    return pipeline.run(config, str(tmp_path / name))

  half = budget(all_problems // 2, "half")["stages"]["prm"]
  group = _config().labels.samples_per_problem
  assert half["prm/label_problems"] == all_problems // 2
  # One problem of the half is held out for validation (valid_fraction .25).
  assert half["prm/train_solutions"] == (all_problems // 2 - 1) * group
  with pytest.raises(config_lib.ConfigError, match="prm.label_problems"):
    budget(all_problems + 1, "too_many")


def test_resuming_with_a_different_config_is_refused(uninterrupted):
  workdir, _ = uninterrupted
  with pytest.raises(config_lib.ConfigError, match="rl.learning_rate"):
    pipeline.run(_config(**{"rl.learning_rate": 1.0}), workdir)


def test_a_key_added_since_the_run_started_is_accepted_at_its_default(
    uninterrupted, tmp_path):
  reference_dir, summary = uninterrupted
  workdir = str(tmp_path / "older")
  shutil.copytree(reference_dir, workdir)
  path = os.path.join(workdir, "config.json")
  older = json.load(open(path))
  del older["prm"]["label_problems"]  # As written before the key existed.
  json.dump(older, open(path, "w"))
  with pytest.raises(config_lib.ConfigError, match="prm.label_problems"):
    pipeline.run(_config(**{"prm.label_problems": 4}), workdir)
  again = pipeline.run(_config(), workdir)
  assert again["stages"] == json.loads(json.dumps(summary["stages"]))
  assert json.load(open(path))["prm"]["label_problems"] == 0


def test_prompt_longer_than_context_is_rejected(tmp_path):
  config = _config(**{"task.max_prompt_len": 8})
  with pytest.raises(ValueError, match="more than max_prompt_len=8"):
    pipeline.run(config, str(tmp_path / "long"))


def test_batch_not_dividing_the_mesh_is_rejected(tmp_path):
  config = _config(**{"mesh.data": 8, "sft.batch_size": 12})
  with pytest.raises(ValueError, match="not divisible by the 8-way"):
    pipeline.run(config, str(tmp_path / "mesh"))


def test_the_logging_section_may_change_on_resume(tmp_path):
  workdir = str(tmp_path)
  config = _config()
  pipeline._check_config_file(config, workdir)  # pylint: disable=protected-access
  config.logging.tensorboard = False
  config.logging.wandb_project = "my-project"
  config.logging.progress = "lines"
  pipeline._check_config_file(config, workdir)  # pylint: disable=protected-access
  # A workdir started before the section existed resumes too.
  path = os.path.join(workdir, "config.json")
  stored = metrics_lib.read_json(path)
  del stored["logging"]
  metrics_lib.write_json_atomic(path, stored)
  pipeline._check_config_file(config, workdir)  # pylint: disable=protected-access
  config.rl.learning_rate = 1.0
  with pytest.raises(config_lib.ConfigError, match="rl.learning_rate"):
    pipeline._check_config_file(config, workdir)  # pylint: disable=protected-access


def test_the_run_writes_tensorboard_files(uninterrupted):
  workdir, _ = uninterrupted
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  reader = event_accumulator.EventAccumulator(
      os.path.join(workdir, "tensorboard"),
      size_guidance={event_accumulator.SCALARS: 0})
  reader.Reload()
  tags = reader.Tags()["scalars"]
  for stage in ("sft", "labels", "prm", "rl"):
    assert any(t.startswith(stage + "/") for t in tags), (stage, tags)
  assert [e.step for e in reader.Scalars("rl/train/reward_mean")] == [1, 2, 3, 4]
  assert [e.step for e in reader.Scalars("rl/eval/accuracy")] == [0, 1, 2, 3, 4]


class _Killed(BaseException):
  """What a kill point raises here instead of SIGKILL (nothing catches it)."""


def _run_killed_at(monkeypatch, spec, workdir):
  """One "process": a run that dies at kill point `spec` (or finishes)."""
  from rl_rewards import kill_points  # pylint: disable=g-import-not-at-top

  def killed():
    raise _Killed(spec)

  with monkeypatch.context() as patch:
    patch.setenv(kill_points.KILL_ENV, spec)
    patch.setattr(kill_points, "kill_now", killed)
    kill_points.reset()
    try:
      with pytest.raises(_Killed):
        pipeline.run(_config(), workdir)
    finally:
      kill_points.reset()


def test_killed_inside_writes_resumes_exactly(uninterrupted, tmp_path,
                                              monkeypatch):
  from experiments.benchmarks import faults  # pylint: disable=g-import-not-at-top
  reference_dir, _ = uninterrupted
  workdir = str(tmp_path / "killed")
  # Inside the second label shard's write (its temporary file is complete).
  _run_killed_at(monkeypatch, "labels.shard:2", workdir)
  assert faults.inspect_kill(workdir)["partial_shard"]
  # Inside the labels stage's done marker: its summary record is written.
  _run_killed_at(monkeypatch, "checkpoint.done:1", workdir)
  assert faults.inspect_kill(workdir)["stage"] == "labels"
  # Records: the labels summary again, prm steps 2 and 4, then half of the
  # prm stage's summary record, after its final checkpoint: the resumed
  # stage must rebuild the same summary.
  _run_killed_at(monkeypatch, "metrics.write:4", workdir)
  assert faults.inspect_kill(workdir) == {
      "stage": "prm", "partial_checkpoint": False, "partial_shard": False,
      "torn_metrics_line": True, "lock_held": False}  # Released on raise.
  # Just before the final RL checkpoint (step 4): resumes from step 2.
  _run_killed_at(monkeypatch, "checkpoint.save:2", workdir)
  pipeline.run(_config(), workdir)
  assert faults.compare(reference_dir, workdir) == []


def test_rl_killed_after_its_final_checkpoint_resumes_exactly(uninterrupted,
                                                              tmp_path):
  from experiments.benchmarks import faults  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  reference_dir, _ = uninterrupted
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference_dir, workdir)
  # What a kill between the final RL checkpoint and its done marker leaves.
  os.remove(os.path.join(workdir, "checkpoints", "rl", "stage_done.json"))
  os.remove(os.path.join(workdir, "summary.json"))
  pipeline.run(_config(), workdir)
  assert faults.compare(reference_dir, workdir) == []


def test_nonfinite_sft_updates_are_skipped_counted_and_stop_the_run(tmp_path):
  from rl_rewards.train import nonfinite  # pylint: disable=g-import-not-at-top
  config = _config(**{"debug.nonfinite_steps": "sft:2:loss_nan"})
  config.stages = "sft"
  summary = pipeline.run(config, str(tmp_path / "one"))
  assert summary["stages"]["sft"]["sft/skipped_updates"] == 1
  assert summary["stages"]["sft"]["sft/steps"] == 4
  records = {r["step"]: r for r in metrics_lib.read_metrics(
      str(tmp_path / "one")) if "train/loss" in r}
  assert [records[s]["train/skipped"] for s in (1, 2, 3, 4)] == [0, 1, 0, 0]
  assert [records[s]["train/skipped_updates"] for s in (1, 2, 3, 4)] == [
      0, 1, 1, 1]
  on_disk = metrics_lib.read_json(str(tmp_path / "one" / "summary.json"))
  assert on_disk["stages"]["sft"]["sft/skipped_updates"] == 1

  config = _config(**{"debug.nonfinite_steps": "sft:1-3",
                      "train.max_consecutive_skips": 3})
  config.stages = "sft"
  with pytest.raises(nonfinite.NonFiniteError,
                     match=r"\[sft\] 3 consecutive .*stopping at sft step 3"):
    pipeline.run(config, str(tmp_path / "three"))
