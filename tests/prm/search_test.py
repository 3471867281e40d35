"""Step-level beam search: candidate scores on a hand-made table, token
accounting, and oracle- vs random-guided search with a scripted policy that
writes each step right with probability p."""

import jax
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import scoring
from rl_rewards.prm import search
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import arith

from . import fakes

NEG = -np.inf
SCORES = [[0.5, 0.8, 0.0, 0.0], [0.6, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
          [0.9, 0.3, 0.7, 0.2]]
MASK = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
V_INIT = [0.3, 0.2, 0.5, 0.4]


@pytest.mark.parametrize("aggregation,want", [
    ("last", [0.8, 0.6, NEG, 0.7]),
    ("min", [0.5, 0.6, NEG, 0.3]),
    ("product", [0.4, 0.6, NEG, 0.9 * 0.3 * 0.7]),
    ("mean", [0.65, 0.6, NEG, (0.9 + 0.3 + 0.7) / 3]),
])
def test_candidate_scores_prm(aggregation, want):
  ranking, final = search.candidate_scores(
      np.asarray(SCORES), np.asarray(MASK, bool), np.asarray(V_INIT),
      mode="prm", aggregation=aggregation)
  np.testing.assert_allclose(ranking, want, rtol=1e-6)
  np.testing.assert_allclose(final, want, rtol=1e-6)


def test_candidate_scores_pav():
  # Q + α (Q^μ_k − Q^μ_{k−1}), Q^μ = 1 − (1 − Q)^K, Q_{k−1} = V for k = 1.
  # K = 2, α = ½: Q^μ(.8) = .96, Q^μ(.5) = .75, Q^μ(.6) = .84,
  # Q^μ(.2) = .36, Q^μ(.7) = .91, Q^μ(.3) = .51.
  ranking, final = search.candidate_scores(
      np.asarray(SCORES), np.asarray(MASK, bool), np.asarray(V_INIT),
      mode="pav", alpha=0.5, prover_k=2)
  np.testing.assert_allclose(
      ranking, [0.8 + 0.5 * (0.96 - 0.75), 0.6 + 0.5 * (0.84 - 0.36), NEG,
                0.7 + 0.5 * (0.91 - 0.51)], rtol=1e-6)
  # The final pick uses Q^π of the last step (the PAV as outcome verifier).
  np.testing.assert_allclose(final, [0.8, 0.6, NEG, 0.7], rtol=1e-6)
  # K = 1: the prover is the policy, the bonus is α (Q_k − Q_{k−1}).
  ranking, _ = search.candidate_scores(
      np.asarray(SCORES), np.asarray(MASK, bool), np.asarray(V_INIT),
      mode="pav", alpha=1.0, prover_k=1)
  np.testing.assert_allclose(ranking, [1.1, 1.0, NEG, 1.1], rtol=1e-6)
  # α = 0: Q^π only.
  ranking, _ = search.candidate_scores(
      np.asarray(SCORES), np.asarray(MASK, bool), np.asarray(V_INIT),
      mode="pav", alpha=0.0, prover_k=4)
  np.testing.assert_allclose(ranking, [0.8, 0.6, NEG, 0.7], rtol=1e-6)


def test_candidate_scores_bad_mode():
  with pytest.raises(ValueError, match="mode"):
    search.candidate_scores(np.zeros((1, 2)), np.ones((1, 2), bool),
                            np.zeros(1), mode="orm")


# ----------------------------------------------------------- beam search ---


@pytest.fixture(scope="module")
def task():
  config = config_lib.base_config().task
  config.min_ops = config.max_ops = 3
  return tasks_lib.ArithTask(config, 0)


def _search(task, policy, scorer, problems, *, beam_width=2, candidates=3,
            seed=0, mode="prm", response_budget=None, step_tokens=12,
            max_rounds=10):
  return search.beam_search(
      policy, scorer, task, problems, beam_width=beam_width,
      candidates=candidates, rng=jax.random.key(seed),
      prompt_width=task.max_prompt_len,
      response_budget=response_budget or task.max_new_tokens, num_steps=8,
      step_tokens=step_tokens, max_rounds=max_rounds, mode=mode,
      aggregation="min", alpha=0.5, prover_k=4)


def _policy(task, p_correct):
  return fakes.ScriptedPolicy(task.tokenizer, p_correct=p_correct,
                              max_new_tokens=task.max_new_tokens)


def test_generated_tokens_are_counted(task):
  problems = task.problems("test", 0, 3)
  policy = _policy(task, 1.0)
  # One beam, one candidate: the search writes one solution step by step:
  # 3 lines of 10 characters + newline, then "#ddd" + EOS.
  result = _search(task, policy, scoring.OracleScorer(task), problems,
                   beam_width=1, candidates=1)
  np.testing.assert_array_equal(result.generated_tokens, [38, 38, 38])
  assert result.rounds == 4
  assert result.texts == [arith.reference_solution(p) for p in problems]
  np.testing.assert_array_equal(result.correct, 1.0)
  # Two beams, three candidates, all equal: round 1 samples 3 candidates for
  # each of the two (identical, empty) beams, which leaves one distinct beam;
  # rounds 2-4 sample 3 candidates for it: 6·11 + 3·11 + 3·11 + 3·5 tokens,
  # counted whether or not a candidate survives.
  result = _search(task, policy, scoring.RandomScorer(0), problems)
  np.testing.assert_array_equal(result.generated_tokens, [147] * 3)


def test_a_beam_ends_on_any_stop_id():
  # A tokenizer with a second stop id (as generation_config.json lists
  # several) and a policy that ends its answers with it.
  config = config_lib.base_config().task
  config.min_ops = config.max_ops = 3
  task = tasks_lib.ArithTask(config, 0)
  task.tokenizer.stop_ids = (task.tokenizer.eos_id, task.tokenizer.pad_id)
  policy = _policy(task, 1.0)
  policy.eos_id = task.tokenizer.pad_id
  problems = task.problems("test", 0, 2)
  result = _search(task, policy, scoring.OracleScorer(task), problems,
                   beam_width=1, candidates=1)
  assert result.texts == [arith.reference_solution(p) for p in problems]
  np.testing.assert_array_equal(result.correct, 1.0)
  assert result.rounds == 4


def test_search_with_a_model_scorer(task):
  # The padded fixed-shape scoring path of a learned verifier.
  problems = task.problems("test", 0, 2)
  config = models.preset("test", task.tokenizer.vocab_size)
  params = models.init_params(config, jax.random.key(0), heads=("score",))
  scorer = scoring.head_scorer(config, params, 8)
  result = _search(task, _policy(task, 1.0), scorer, problems)
  np.testing.assert_array_equal(result.correct, 1.0)
  np.testing.assert_array_equal(result.generated_tokens, [147, 147])


def test_oracle_guided_search_beats_random_guided(task):
  problems = task.problems("test", 0, 24)
  # Each step right with probability 0.6: a whole 4-step solution with
  # probability 0.6^4 ≈ 0.13.
  policy = _policy(task, 0.6)
  oracle = _search(task, policy, scoring.OracleScorer(task), problems)
  value = _search(task, policy, scoring.OracleScorer(task, as_value=True),
                  problems, mode="pav")
  random = _search(task, policy, scoring.RandomScorer(0), problems)
  assert oracle.correct.mean() >= 0.6, oracle.correct.mean()
  assert value.correct.mean() >= 0.6, value.correct.mean()
  assert random.correct.mean() <= 0.3, random.correct.mean()
  assert oracle.correct.mean() - random.correct.mean() >= 0.4
  # Same settings, same compute: every beam samples every round.
  for result in (oracle, value, random):
    assert result.rounds == 4
    assert (result.generated_tokens > 0).all()
    assert (result.generated_tokens <= 6 * 38).all()
  # Each chosen answer's verdict is the task's.
  for problem, text, correct in zip(problems, oracle.texts, oracle.correct):
    assert correct == arith.outcome_reward(problem, text, True)


def test_dead_beams(task):
  problems = task.problems("test", 0, 2)
  policy = _policy(task, 1.0)
  # Steps longer than the step budget: every candidate is cut, search ends.
  result = _search(task, policy, scoring.OracleScorer(task), problems,
                   step_tokens=5)
  assert result.rounds == 1
  np.testing.assert_array_equal(result.correct, 0.0)
  np.testing.assert_array_equal(result.generated_tokens, 6 * 5)
  # A response budget below the solution length: nothing finishes.
  result = _search(task, policy, scoring.OracleScorer(task), problems,
                   response_budget=30)
  np.testing.assert_array_equal(result.correct, 0.0)
  assert result.rounds <= 4


def test_beam_search_rejects_bad_widths(task):
  with pytest.raises(ValueError, match="beam_width"):
    _search(task, _policy(task, 1.0), scoring.RandomScorer(0),
            task.problems("test", 0, 1), beam_width=0)
