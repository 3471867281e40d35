"""Turn labels of multi-turn episodes: the environment restored by replaying
a prefix's turns, episodes continued from a prefix in the KV cache, Monte-
Carlo Q-hat per turn (hand-computed with a scripted prover that plays the
real environment), and the label records in the layout the prm stage
trains on (turns as steps, observations never scored)."""

import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import errors
from rl_rewards import models
from rl_rewards.envs import batched
from rl_rewards.prm import label_store
from rl_rewards.prm import labels
from rl_rewards.prm import scoring
from rl_rewards.prm import training
from rl_rewards.rollout import episodes
from rl_rewards.runners import tasks
from rl_rewards.tasks import arith
from rl_rewards.tasks import hidden_operands as ho

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# x0+x1-x2 with x0=23, x1=7, x2=9: values 23, 30, 21.
PROBLEM = ho.problem_from_chain(
    arith.problem_from_chain(23, "+-", [7, 9], split="train", index=0))


@pytest.fixture(scope="module")
def task():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "multiturn.py") + ":size=test")
  return tasks.make_task(config.task, seed=0)


@pytest.fixture(scope="module")
def policy(task):
  cfg = models.preset("test", task.tokenizer.vocab_size)
  return cfg, models.init_params(cfg, jax.random.key(0))


def _episode(task, problem, actions, *, index=0) -> labels.EpisodeSolution:
  """The episode of `actions` as `sample_episodes` lays it out: each turn
  followed by the environment's observation (none after the last)."""
  env = ho.HiddenOperandsEnv()
  env.reset(problem)
  response, turn_ids = [], []
  outcome = 0.0
  for j, action in enumerate(actions):
    ids = task.tokenizer.encode(action)
    response += ids
    turn_ids += [j] * len(ids)
    observation, reward, done, _ = env.step(action)
    outcome = reward
    if observation and j + 1 < len(actions) and not done:
      obs = task.tokenizer.encode(observation)[:task.max_observation_tokens]
      response += obs
      turn_ids += [-1] * len(obs)
  prompt, mask = task.encode_prompts([problem])
  return labels.EpisodeSolution(
      problem=problem, split="train", index=index,
      prompt_ids=prompt[0][mask[0].astype(bool)].tolist(),
      response_ids=response, turn_ids=turn_ids, finished=True,
      outcome=float(outcome), text=task.tokenizer.decode(response),
      actions=list(actions))


class ScriptedProver:
  """`EpisodeProver.continue_prefixes` by a script on the real environment.

  Each row replays its prefix through a fresh `HiddenOperandsEnv` (the
  observations it returns are what the environment answers). Rollout i of a
  prefix (rows are prefix-major, `num_rollouts` each) succeeds iff every
  prefix turn made progress and i < `wins`: Q-hat = wins / m after an
  error-free prefix, 0 after a wasted or wrong turn. `noise` adds a counter
  to every value the tool returns (a non-deterministic environment).
  """

  def __init__(self, task, num_rollouts, wins, noise=False):
    self.task, self.m, self.wins, self.noise = task, num_rollouts, wins, noise
    self.calls = 0

  def continue_prefixes(self, problems, prefix_turns, rng, *, rows=0):
    del rng
    self.calls += 1
    tokenizer = self.task.tokenizer
    rewards, responses = [], []
    for r, (problem, turns) in enumerate(zip(problems, prefix_turns)):
      env = ho.HiddenOperandsEnv()
      env.reset(problem)
      response, clean = [], True
      for turn in turns:
        observation, _, _, info = env.step(tokenizer.decode(turn))
        clean &= info["progress"]
        if self.noise and observation.startswith("x"):
          observation = observation.replace("=", f"={self.calls % 10}")
        response += list(turn) + tokenizer.encode(observation)[
            :self.task.max_observation_tokens]
      rewards.append(float(clean and r % self.m < self.wins))
      responses.append(response)
    return np.asarray(rewards), responses, 0


# ------------------------------------------------- replay and continuation --


def test_replaying_the_actions_restores_the_environment():
  actions = ["get x0\n", "get x5\n", "get x1\n", "023+07=030\n", "get x0\n",
             "12+1=13\n", "get x2\n", "030-09=021\n"]
  env = ho.HiddenOperandsEnv()
  env.reset(PROBLEM)
  played = [env.step(a) for a in actions]
  for k in range(len(actions) + 1):
    fresh = ho.HiddenOperandsEnv()
    fresh.reset(PROBLEM)
    replayed = [fresh.step(a) for a in actions[:k]]
    assert replayed == played[:k]  # Equal observations, rewards, infos.
    # The same state: the next turns go on identically.
    reference = ho.HiddenOperandsEnv()
    reference.reset(PROBLEM)
    for a in actions[:k]:
      reference.step(a)
    assert fresh.state == reference.state
    assert [fresh.step(a) for a in actions[k:]] == [
        reference.step(a) for a in actions[k:]]
  assert fresh.step("#021\n")[1:3] == (1.0, True)


def test_greedy_continuation_reproduces_the_episode(task, policy):
  """Greedy decoding from a prefix of a greedy episode, the environment
  replayed and the prefix prefilled, is that episode: the same tokens
  (observations re-created by the replay), turns and log-probs."""
  cfg, params = policy
  problems = task.problems("train", 0, 4)
  out = task.sample_episodes(cfg, params, problems, jax.random.key(1),
                             temperature=0.0)
  k = 1
  rows = np.nonzero(out.num_turns > k)[0]  # Episodes that went on.
  assert len(rows) >= 2
  out = out._replace(
      **{f: v[rows] for f, v in out._asdict().items()
         if isinstance(v, np.ndarray)},
      **{f: [getattr(out, f)[r] for r in rows]
         for f in ("actions", "observations", "infos")})
  problems = [problems[r] for r in rows]
  solutions = labels.episode_solutions(task, problems, ["train"] * len(rows),
                                       rows, out)
  prefix = [s.turns(k) for s in solutions]
  assert prefix[0] == (tuple(out.tokens[0][out.turn_ids[0] == 0]),)
  cont = task.continue_episodes(cfg, params, problems, prefix,
                                jax.random.key(7), temperature=0.0)
  np.testing.assert_array_equal(cont.tokens, out.tokens)
  np.testing.assert_array_equal(cont.turn_ids, out.turn_ids)
  np.testing.assert_array_equal(cont.response_mask, out.response_mask)
  np.testing.assert_array_equal(cont.turn_rewards, out.turn_rewards)
  assert cont.actions == out.actions
  assert cont.observations == out.observations
  later = out.turn_ids >= k
  np.testing.assert_allclose(cont.logprobs[later], out.logprobs[later],
                             atol=1e-5)
  assert not cont.logprobs[(out.turn_ids >= 0) & ~later].any()
  # A prefix that ends the episode, or rows with different k, are refused.
  env = batched.BatchedEnv(ho.HiddenOperandsEnv)
  answer = [task.tokenizer.encode("#021\n")]
  with pytest.raises(errors.InputError, match="ended the episode"):
    episodes.continue_episodes(
        cfg, params, env, [PROBLEM], [answer], task.tokenizer,
        jax.random.key(0), **_kwargs(task))
  with pytest.raises(errors.InputError, match="same number of turns"):
    episodes.continue_episodes(
        cfg, params, env, [PROBLEM] * 2, [prefix[0], ()],
        task.tokenizer, jax.random.key(0), **_kwargs(task))


def _kwargs(task):
  return dict(max_prompt_len=task.max_prompt_len,
              max_episode_tokens=task.max_new_tokens,
              max_turns=task.max_turns, max_turn_tokens=task.max_turn_tokens,
              max_observation_tokens=task.max_observation_tokens,
              end_of_turn_ids=task.end_of_turn_ids,
              eos_id=task.tokenizer.stop_ids)


@pytest.mark.slow  # ~30 s of compiles on a cold cache.
def test_real_prover_labels_of_greedy_episodes_are_their_outcomes(
    task, policy):
  """With greedy decoding every continuation of a prefix is the episode
  itself, so Q-hat of every turn and V-hat are the episode's outcome; the
  replay check passes on the real environment."""
  cfg, params = policy
  problems = task.problems("train", 0, 3)
  prover = labels.EpisodeProver(task, cfg, params, temperature=0.0)
  out = prover.sample(problems, jax.random.key(1), num_samples=1)
  solutions = labels.episode_solutions(task, problems, ["train"] * 3,
                                       range(3), out)
  records, stats = labels.episode_monte_carlo_labels(
      prover, solutions, num_rollouts=2, rng=jax.random.key(2),
      batch_size=4)
  for solution, record in zip(solutions, records):
    assert record["q"] == [solution.outcome] * solution.num_steps
    assert record["v"] == solution.outcome
    assert record["turn_ids"] == solution.turn_ids
  assert stats["prefixes"] == sum(s.num_steps for s in solutions)
  assert stats["generated_tokens"] > 0


# ------------------------------------------------------ hand-checked Q-hat --


def test_turn_labels_hand_computed(task):
  clean = ho.reference_actions(PROBLEM)  # 6 turns, all progress, right.
  wasted = clean[:1] + clean[:1] + clean[1:]  # "get x0" twice: 7 turns.
  assert clean == ["get x0\n", "get x1\n", "023+07=030\n", "get x2\n",
                   "030-09=021\n", "#021\n"]
  solutions = [_episode(task, PROBLEM, clean),
               _episode(task, PROBLEM, wasted)]
  prover = ScriptedProver(task, num_rollouts=4, wins=3)
  records, stats = labels.episode_monte_carlo_labels(
      prover, solutions, num_rollouts=4, rng=jax.random.key(0),
      batch_size=8)
  # Clean: Q-hat 3/4 after every error-free prefix, the last turn's is the
  # outcome (1); V-hat = 3/4 (the empty prefix has no error).
  assert records[0]["q"] == [0.75] * 5 + [1.0]
  assert records[0]["hard"] == [1.0] * 6
  assert records[0]["v"] == 0.75
  assert records[0]["rollouts"] == [4] * 5 + [0]
  # Wasted: the second "get x0" makes no progress, so every prefix from it
  # on has Q-hat 0; the answer is still right.
  assert records[1]["q"] == [0.75] + [0.0] * 5 + [1.0]
  assert records[1]["hard"] == [1.0] + [0.0] * 5 + [1.0]
  # Unique prefixes: the empty one and "get x0" are shared; 5 more each.
  assert stats["prefixes"] == 1 + 1 + 4 + 5
  assert stats["rollouts"] == 4 * stats["prefixes"]
  # Prefixes of k turns go together: one call per k (1..6), one for k = 0.
  assert prover.calls == 7


def test_a_replay_with_other_observations_is_refused(task):
  solutions = [_episode(task, PROBLEM, ho.reference_actions(PROBLEM))]
  prover = ScriptedProver(task, num_rollouts=2, wins=1, noise=True)
  with pytest.raises(errors.InputError, match="deterministic environment"):
    labels.episode_monte_carlo_labels(prover, solutions, num_rollouts=2,
                                      rng=jax.random.key(0), batch_size=4)


# -------------------------------------------- the records the prm stage reads --


def _record(task, solution, label):
  return dict(split="train", index=solution.index, question="q",
              prompt_ids=solution.prompt_ids,
              response_ids=solution.response_ids, text=solution.text,
              finished=True, outcome=solution.outcome, oracle=None,
              first_error=None, **label)


def test_records_train_on_turns_with_observations_unscored(task, tmp_path):
  clean = ho.reference_actions(PROBLEM)
  solutions = [_episode(task, PROBLEM, clean),
               _episode(task, PROBLEM, clean[:1] + clean[:1] + clean[1:])]
  found, _ = labels.episode_monte_carlo_labels(
      ScriptedProver(task, 4, 3), solutions, num_rollouts=4,
      rng=jax.random.key(0), batch_size=8)
  records = [_record(task, s, r) for s, r in zip(solutions, found)]
  label_store.write_shard(str(tmp_path), 0, records)
  label_store.write_manifest(str(tmp_path), {"num_shards": 1})
  _, read = label_store.read_label_set(str(tmp_path))
  assert read[1]["turn_ids"] == solutions[1].turn_ids
  width, budget, slots = task.max_prompt_len, task.max_new_tokens, 10
  arrays = training.label_arrays(
      read, prompt_width=width, response_budget=budget, num_steps=slots,
      delimiter_mask=task.delimiter_mask(), eos_id=task.tokenizer.stop_ids,
      pad_id=task.tokenizer.pad_id, target="soft")
  for i, solution in enumerate(solutions):
    ids = arrays["step_ids"][i]
    np.testing.assert_array_equal(
        ids[width:width + len(solution.turn_ids)], solution.turn_ids)
    assert (ids[:width] == -1).all()
    assert (ids[width + len(solution.turn_ids):] == -1).all()
    # Observation tokens ("x1=07\n") are attended to, never in the response.
    observation = np.zeros_like(ids, bool)
    observation[width:width + len(solution.turn_ids)] = (
        np.asarray(solution.turn_ids) < 0)
    fetches = sum(a.startswith("get") for a in solution.actions)
    assert observation.sum() == 6 * fetches  # "xi=VV\n" after each fetch.
    assert arrays["attention_mask"][i][observation].all()
    assert not arrays["response_mask"][i][observation].any()
    k = solution.num_steps
    np.testing.assert_allclose(arrays["targets"][i, :k], found[i]["q"])
    assert arrays["target_mask"][i, :k].all()
    assert not arrays["target_mask"][i, k:].any()
    assert arrays["v_target"][i] == 0.75
  # The score head reads turn k at its last token (the newline before the
  # tool's answer) and V at the prompt's last token, not an observation's.
  tokens = arrays["tokens"][:1]
  token_logits = np.arange(tokens.size, dtype=np.float32).reshape(
      tokens.shape) / 100
  step_scores, step_mask, v_init = scoring.step_scores_from_token_logits(
      token_logits, arrays["attention_mask"][:1], arrays["step_ids"][:1],
      slots)
  turn_ids = np.asarray(solutions[0].turn_ids)
  ends = [width + int(np.nonzero(turn_ids == j)[0][-1]) for j in range(6)]
  np.testing.assert_allclose(np.asarray(step_scores)[0, :6],
                             jax.nn.sigmoid(token_logits[0, ends]), rtol=1e-6)
  assert np.asarray(step_mask)[0].sum() == 6
  np.testing.assert_allclose(np.asarray(v_init)[0],
                             jax.nn.sigmoid(token_logits[0, width - 1]),
                             rtol=1e-6)


@pytest.mark.parametrize("turn_ids,match", [
    ("drop_last", "entries"), ("reorder", "in order"), ("bad", "list of ints")])
def test_malformed_turn_ids_are_refused(task, turn_ids, match):
  solution = _episode(task, PROBLEM, ho.reference_actions(PROBLEM))
  record = _record(task, solution, dict(
      q=[0.5] * 6, hard=[1.0] * 6, rollouts=[1] * 6, v=0.5, v_rollouts=1,
      turn_ids=list(solution.turn_ids)))
  label_store.validate_record(record, "ok")
  ids = record["turn_ids"]
  if turn_ids == "drop_last":
    record["turn_ids"] = ids[:-1]
  elif turn_ids == "reorder":
    record["turn_ids"] = [1 if t == 0 else 0 if t == 1 else t for t in ids]
  else:
    record["turn_ids"] = ["0"] * len(ids)
  with pytest.raises(errors.InputError, match=match):
    label_store.validate_record(record, "shard-00000.jsonl:1")
