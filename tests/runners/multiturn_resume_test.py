"""A multi-turn RL run killed between two turns of an episode resumes exactly.

The kill point `episodes.turn` fires inside `rollout.episodes.sample_episodes`
between two turns, when the KV cache, the environments and the turns so far
exist only in memory. A run killed there (in the first RL step, before any
RL checkpoint, then in the second, after the first step's checkpoint) and
rerun must end with the same metrics.jsonl, checkpoints and summary as a run
that was never killed.
"""

import os

import jax
import pytest

from experiments.benchmarks import faults
from rl_rewards import cli
from rl_rewards import kill_points
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.envs import batched
from rl_rewards.rollout import episodes
from rl_rewards.runners import pipeline
from rl_rewards.runners import rl
from rl_rewards.tasks import hidden_operands as ho

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _config():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "multiturn.py") + ":size=test")
  config.stages = "rl"
  config.rl.steps = 2
  config.rl.checkpoint_every_steps = 1
  config.rl.eval_every_steps = 2
  config.eval.size_per_k = 2
  config.eval.batch_size = 8
  config.eval.pass_n = 1
  return config


class _Killed(BaseException):
  """What a kill point raises here instead of SIGKILL (nothing catches it)."""


def _run(monkeypatch, workdir, kill_at="", trace=""):
  """One "process": a run that dies at `kill_at` (or finishes)."""

  def killed():
    raise _Killed(kill_at)

  with monkeypatch.context() as patch:
    patch.delenv(kill_points.KILL_ENV, raising=False)
    patch.delenv(kill_points.TRACE_ENV, raising=False)
    if kill_at:
      patch.setenv(kill_points.KILL_ENV, kill_at)
    if trace:
      patch.setenv(kill_points.TRACE_ENV, trace)
    patch.setattr(kill_points, "kill_now", killed)
    kill_points.reset()
    try:
      if kill_at:
        with pytest.raises(_Killed):
          pipeline.run(_config(), workdir)
      else:
        pipeline.run(_config(), workdir)
    finally:
      kill_points.reset()


def _rollout_turns(monkeypatch, workdir, trace):
  """Runs to the end, tracing kill points; returns the counts of
  `episodes.turn` that each RL step's rollout passed (evaluations pass
  others in between)."""
  steps = []
  counts = kill_points._counts  # pylint: disable=protected-access

  def counted(ctx, params, step, _rollout=rl.rollout_episodes):
    before = counts.get("episodes.turn", 0)
    out = _rollout(ctx, params, step)
    after = counts.get("episodes.turn", 0)
    steps.append(list(range(before + 1, after + 1)))
    return out

  with monkeypatch.context() as patch:
    patch.setattr(rl, "rollout_episodes", counted)
    _run(monkeypatch, workdir, trace=trace)
  return steps


class _CountingEnv:
  """Never done; counts the turns it was given."""
  turns = []

  def reset(self, problem):
    return problem.question

  def step(self, action):
    self.turns.append(action)
    return "x0=1\n", 0.0, False, {}


def test_the_point_lies_between_two_turns(monkeypatch):
  tokenizer = ho.make_tokenizer()
  cfg = models.preset("test", tokenizer.vocab_size)
  params = models.init_params(cfg, jax.random.key(0))
  problems = ho.make_problems(ho.HiddenOperandsConfig(), "train", range(2))

  def run():
    _CountingEnv.turns = []
    return episodes.sample_episodes(
        cfg, params, batched.BatchedEnv(_CountingEnv), problems, tokenizer,
        jax.random.key(0), max_prompt_len=24, max_episode_tokens=40,
        max_turns=3, max_turn_tokens=8, max_observation_tokens=8,
        end_of_turn_ids=tokenizer.encode("\n"), eos_id=())

  def killed():
    raise _Killed("episodes.turn")

  with monkeypatch.context() as patch:
    patch.setattr(kill_points, "kill_now", killed)
    patch.setenv(kill_points.KILL_ENV, "episodes.turn:2")
    kill_points.reset()
    try:
      with pytest.raises(_Killed):
        run()
      # Killed after the second turn's observations, before the third.
      assert len(_CountingEnv.turns) == 2 * len(problems)
      kill_points.reset()
      patch.setenv(kill_points.KILL_ENV, "episodes.turn:3")
      out = run()  # Three turns pass the point twice.
    finally:
      kill_points.reset()
  assert (out.num_turns == 3).all()


@pytest.mark.slow  # Three runs of the RL stage: ~15 s of CPU.
def test_killed_between_turns_resumes_exactly(tmp_path, monkeypatch):
  reference = str(tmp_path / "reference")
  trace = str(tmp_path / "trace.jsonl")
  first, second = _rollout_turns(monkeypatch, reference, trace)
  assert len(first) >= 2 and len(second) >= 2, (first, second)
  assert second[0] > first[-1]

  workdir = str(tmp_path / "killed")
  # Second turn of step 1's rollout: no RL checkpoint yet.
  _run(monkeypatch, workdir, kill_at=f"episodes.turn:{first[1]}")
  assert faults.inspect_kill(workdir, stages=("rl",))["stage"] == "rl"
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "rl",
                                         "stage_done.json"))
  # Last turn of step 2's rollout: resumes from step 1's checkpoint.
  _run(monkeypatch, workdir, kill_at=f"episodes.turn:{second[-1]}")
  records = metrics_lib.read_metrics(workdir)
  assert [r["step"] for r in records if "train/loss" in r] == [1]
  _run(monkeypatch, workdir)

  assert faults.compare(reference, workdir) == []
  got = metrics_lib.read_metrics(workdir)
  assert [r["step"] for r in got if "train/loss" in r] == [1, 2]
  assert len(got) == len(metrics_lib.read_metrics(reference))
