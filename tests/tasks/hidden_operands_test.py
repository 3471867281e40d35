"""Tests of the hidden-operands task: its per-turn oracle and environment."""

import numpy as np
import pytest

from rl_rewards import errors
from rl_rewards.tasks import arith
from rl_rewards.tasks import hidden_operands as ho

# 23 + 7 - 15: running values 23, 30, 15; x3 = 40 is a distractor.
CHAIN = arith.problem_from_chain(23, ["+", "-"], [7, 15])
PROBLEM = ho.problem_from_chain(CHAIN, distractors=[40])


def test_problem_hides_the_numbers():
  assert PROBLEM.question == "x0+x1-x2="
  assert PROBLEM.stored == (23, 7, 15, 40)
  assert PROBLEM.num_needed == 3 and PROBLEM.answer == 15


def test_reference_episode_is_all_progress():
  actions = ho.reference_actions(PROBLEM)
  assert actions == ["get x0\n", "get x1\n", "023+07=030\n", "get x2\n",
                     "030-15=015\n", "#015\n"]
  labels = ho.label_turns(PROBLEM, actions)
  assert labels == ho.TurnLabels([True] * 6, True, True, -1)


def test_hand_written_episode_with_wasted_turns():
  # turn: action             -> progress, why
  actions = [
      "get x1",            # T: needed, first fetch
      "get x1",            # F: fetched before
      "get x3",            # F: a distractor
      "023+07=030",        # F: right numbers, but x0 was never fetched
      "get x0",            # T
      "023+07=030",        # T: the first partial result
      "030-15=015",        # F: x2 not fetched yet (a guess)
      "get x9",            # F: no such variable
      "get x2",            # T
      "030-15=015",        # T
      "#015",              # T: right answer
  ]
  labels = ho.label_turns(PROBLEM, actions)
  assert labels.labels == [True, False, False, False, True, True, False,
                           False, True, True, True]
  assert labels.answer_correct and labels.finished
  assert labels.first_error == 1


def test_wrong_steps_and_turns_after_the_answer():
  actions = ["get x0", "get x1", "023+07=031", "023-07=016", "30+7=37",
             "hello", "#016", "get x2"]
  labels = ho.label_turns(PROBLEM, actions)
  # Wrong sum, wrong operator, wrong running value, unparsable, wrong
  # answer, and a turn after the episode ended.
  assert labels.labels == [True, True] + [False] * 6
  assert not labels.answer_correct and labels.finished
  # Unpadded numbers are read too: "23+7=30" is the first step.
  assert ho.label_turns(PROBLEM, ["get x0", "get x1", "23+7=30"]).labels == [
      True, True, True]


def test_environment_matches_the_oracle():
  actions = ["get x1", "get x3", "get x7", "x", "get x0", "023+07=030",
             "get x2", "030-15=015", "#015"]
  env = ho.HiddenOperandsEnv()
  assert env.reset(PROBLEM) == "x0+x1-x2="
  steps = [env.step(a + "\n") for a in actions]
  observations = [s[0] for s in steps]
  assert observations == ["x1=07\n", "x3=40\n", "?\n", "?\n", "x0=23\n", "",
                          "x2=15\n", "", ""]
  assert [s[1] for s in steps] == [0.0] * 8 + [1.0]
  assert [s[2] for s in steps] == [False] * 8 + [True]
  assert [s[3]["progress"] for s in steps] == ho.label_turns(
      PROBLEM, actions).labels
  with pytest.raises(errors.InputError, match="over"):
    env.step("get x0")


def test_oracle_turn_labels_batch():
  labels, mask = ho.oracle_turn_labels(
      [PROBLEM, PROBLEM], [["get x0", "get x0"], []], max_turns=3)
  np.testing.assert_array_equal(labels, [[1, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 0], [0, 0, 0]])
  with pytest.raises(errors.InputError, match="row 0 has 4 turns"):
    ho.oracle_turn_labels([PROBLEM], [["a"] * 4], max_turns=3)


def test_generated_problems_are_seeded_and_split():
  cfg = ho.HiddenOperandsConfig(num_distractors=2)
  a, b = ho.make_problem(cfg, 5), ho.make_problem(cfg, 5)
  assert a == b and len(a.stored) == a.num_needed + 2
  heldout = ho.make_problem(cfg, 5, "eval")
  assert heldout.chain == arith.make_problem(cfg.chains, 5, "eval")
  # The tokenizer covers every action and observation of the task.
  tok = ho.make_tokenizer()
  for text in ho.reference_actions(a) + [ho.value_line(a, 0), ho.UNKNOWN]:
    assert tok.decode(tok.encode(text)) == text
