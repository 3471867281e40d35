"""RL on multi-turn episodes (hidden operands) through the one RL loop: the
task's SFT rows, the rollout batch, observation tokens out of every loss,
and the loop itself at test size."""

import math
import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import programs
from rl_rewards.runners import rl
from rl_rewards.runners import step_scores
from rl_rewards.tasks import hidden_operands as ho

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _config(arg="size=test", file="multiturn.py"):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", file) + ":" + arg)
  config.stages = "rl"
  config.rl.steps = 1
  config.eval.size_per_k = 2
  config.eval.batch_size = 4
  config.eval.pass_n = 1
  return config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(ctx, random policy params, rollout of step 0) at test size."""
  config = _config()
  config.rl.kl_coef = 0.1  # The KL term is checked too.
  ctx = pipeline.build_context(config, str(tmp_path_factory.mktemp("mt")))
  params = pipeline.initial_params(ctx)
  yield ctx, params, rl.rollout_episodes(ctx, params, 0)
  ctx.writer.close()


def test_sft_rows_are_optimal_episodes_trained_on_turns_only(run):
  ctx = run[0]
  task = ctx.task
  problems = task.problems("train", 0, 3)
  rows = task.encode_sft(problems)
  prompt_len = task.max_prompt_len
  for row, problem in enumerate(problems):
    tokens = rows["tokens"][row, prompt_len:]
    loss = rows["loss_mask"][row, prompt_len:].astype(bool)
    attended = rows["attention_mask"][row, prompt_len:].astype(bool)
    # What the environment answers to the optimal turns, in order.
    env = ho.HiddenOperandsEnv()
    env.reset(problem)
    turns = ho.reference_actions(problem)
    episode, observations = "", ""
    for i, turn in enumerate(turns):
      observation = env.step(turn)[0] if i + 1 < len(turns) else ""
      episode += turn + observation
      observations += observation
    assert task.tokenizer.decode(tokens[attended]) == episode
    assert task.tokenizer.decode(tokens[loss]) == "".join(turns)
    assert task.tokenizer.decode(tokens[attended & ~loss]) == observations
    assert observations.count("=") == problem.num_needed  # "xi=V" lines.
    assert not loss[~attended].any()


def test_rollout_batch_is_the_sampled_episodes(run):
  ctx, params, (out, scored, info) = run
  cfg = ctx.config.rl
  problems = rl.rollout_problems(ctx, 0)
  episodes = ctx.task.sample_episodes(
      ctx.model_config, params, problems, ctx.rng("rollout", 0),
      temperature=cfg.temperature, top_p=cfg.top_p,
      num_samples=cfg.group_size)
  tokens = np.asarray(out.tokens)
  response = np.asarray(out.response_mask)
  step_ids = np.asarray(out.step_ids)
  np.testing.assert_array_equal(tokens, episodes.tokens)
  np.testing.assert_array_equal(response, episodes.response_mask)
  np.testing.assert_array_equal(np.asarray(out.logprobs), episodes.logprobs)
  # Policy tokens are exactly the tokens with a turn id; observations are
  # attended to but never trained on.
  np.testing.assert_array_equal(response, (step_ids >= 0).astype(np.int32))
  observation = episodes.observation_mask.astype(bool)
  assert observation.sum() > 0  # The random policy's lines get "?".
  assert not response[observation].any()
  assert np.asarray(out.attention_mask)[observation].all()
  # Outcome and per-turn labels are the oracle's on the turns' texts.
  repeated = [p for p in problems for _ in range(cfg.group_size)]
  for row, (problem, turns) in enumerate(zip(repeated, episodes.actions)):
    verdict = ho.label_turns(problem, turns)
    assert scored.rewards[row] == float(verdict.answer_correct)
    assert scored.step_labels[row] == verdict.labels
    assert len(turns) == step_ids[row].max() + 1
  oracle = step_scores.oracle_step_arrays(scored.step_labels,
                                          ctx.config.task.max_steps)
  labels, mask = ho.oracle_turn_labels(repeated, episodes.actions,
                                       ctx.config.task.max_steps)
  np.testing.assert_array_equal(oracle["labels"], labels * mask)
  assert info["num_tokens"] == episodes.lengths.sum()
  # π_old from the sampler is the update's forward pass (float32, T = 1).
  update_pass = programs.logprob_pass(ctx.config, ctx.model_config)
  recomputed = np.asarray(update_pass(params, out.tokens, out.attention_mask))
  on = response.astype(bool)
  np.testing.assert_allclose(episodes.logprobs[on], recomputed[on], atol=2e-5)


def _policy_stepper(ctx, params):
  """batch -> (updated params, metrics) of one policy update from
  `params`, jitted once."""
  update = programs.policy_update(ctx.config, ctx.model_config)
  _, shardings = context_lib.create_state(ctx.model_config, ctx.mesh, params,
                                          update.tx)
  step = update.jit(shardings, ctx.mesh)

  def run_step(batch):
    state, _ = context_lib.create_state(ctx.model_config, ctx.mesh, params,
                                        update.tx)
    state, metrics = step(state, dict(batch))
    return (jax.tree.map(np.asarray, state.params),
            {k: float(v) for k, v in metrics.items()})
  return run_step


def test_observation_tokens_change_no_loss_kl_or_update(run):
  ctx, params, (out, _, _) = run
  assert ctx.config.rl.kl_coef > 0
  rng = np.random.default_rng(0)
  shape = out.tokens.shape
  observation = (np.asarray(out.attention_mask) *
                 (1 - np.asarray(out.response_mask))).astype(bool)
  observation[:, :ctx.task.max_prompt_len] = False
  batch = {"tokens": out.tokens, "attention_mask": out.attention_mask,
           "response_mask": out.response_mask,
           "old_logprobs": np.asarray(out.logprobs),
           "ref_logprobs": np.asarray(out.logprobs) - 0.1,
           "advantages": rng.normal(size=shape).astype(np.float32)}
  policy_step = _policy_stepper(ctx, params)
  base_params, base = policy_step(batch)

  def perturbed(where):
    noisy = dict(batch)
    for key in ("old_logprobs", "ref_logprobs", "advantages"):
      noisy[key] = np.where(where, batch[key] + rng.normal(size=shape) * 3,
                            batch[key]).astype(np.float32)
    return policy_step(noisy)

  new_params, metrics = perturbed(observation)
  for key in ("loss", "pg_loss", "kl", "neg_logprob", "ppo_kl", "clipfrac"):
    assert metrics[key] == base[key], key
  jax.tree.map(np.testing.assert_array_equal, new_params, base_params)
  # The same perturbation on policy tokens does move them.
  _, moved = perturbed(np.asarray(out.response_mask).astype(bool))
  assert moved["loss"] != base["loss"] and moved["kl"] != base["kl"]


# One RL step of the whole stage (evaluations included); outcome-only GRPO
# and G-RA (configs/gra.py) under `-m slow`.
@pytest.mark.parametrize("method", [
    "oracle", pytest.param("grpo", marks=pytest.mark.slow),
    pytest.param("gra", marks=pytest.mark.slow)])
def test_loop_runs_on_episodes(method, tmp_path):
  config = (_config(file="gra.py") if method == "gra" else
            _config(f"size=test,method={method}"))
  workdir = str(tmp_path / "run")
  ctx = pipeline.build_context(config, workdir)
  params = pipeline.initial_params(ctx)
  _, summary = rl.run(ctx, params)
  ctx.writer.close()
  assert summary["rl/steps"] == 1
  [record] = [r for r in metrics_lib.read_metrics(workdir)
              if r["stage"] == "rl" and "train/loss" in r]
  for key in ("train/loss", "train/advantage_var", "rollout/turns_mean",
              "rollout/observation_tokens_mean", "train/steps_per_response"):
    assert math.isfinite(record[key]), key
  assert record["rollout/turns_mean"] >= 1
  assert record["train/steps_per_response"] == record["rollout/turns_mean"]
  assert math.isfinite(summary["eval/accuracy"])


def test_config_checks_of_the_multiturn_task():
  config = _config()
  config_lib.validate(config)
  config.stages = "sft,prm_eval,rl"
  with pytest.raises(config_lib.ConfigError, match="config.stages"):
    config_lib.validate(config)
  config = _config()
  config.task.max_turns = 0
  with pytest.raises(config_lib.ConfigError, match="config.task.max_turns"):
    config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError, match="method"):
    _config("size=test,method=ppo")
