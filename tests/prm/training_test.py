"""PRM training: the cross-entropy against hand computations, label arrays
from hand-made records, and a few update steps on a tiny label set."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import labels
from rl_rewards.prm import training
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import arith
from rl_rewards.train import optim
from rl_rewards.train import state as state_lib


def bce(p, y):
  return -(y * math.log(p) + (1 - y) * math.log(1 - p))


# ------------------------------------------------------------- prm_loss ---

P = [[0.9, 0.2, 0.6], [0.5, 0.7, 0.1]]
MASK = [[1, 1, 0], [1, 0, 0]]


def _loss(targets, *, value_weight, p=P, balance=False, v_mask=(1, 0)):
  p = jnp.asarray(p, jnp.float32)
  batch = {"targets": jnp.asarray(targets, jnp.float32),
           "target_mask": jnp.asarray(MASK, bool),
           "v_target": jnp.asarray([0.5, 1.0]),
           "v_mask": jnp.asarray(v_mask, bool)}
  return training.prm_loss(jnp.log(p), jnp.log1p(-p),
                           jnp.asarray([0.0, 2.0]), batch,
                           value_weight=value_weight,
                           balance_classes=balance)


def test_prm_loss_soft_targets_hand_computed():
  loss, metrics = _loss([[1.0, 0.25, 0.5], [0.0, 1.0, 1.0]], value_weight=0.5)
  # Labelled steps (0,0) (0,1) (1,0); V of row 0 (logit 0, target ½) at
  # weight ½; row 1's V is unknown.
  want = (bce(0.9, 1.0) + bce(0.2, 0.25) + bce(0.5, 0.0) +
          0.5 * bce(0.5, 0.5)) / (3 + 0.5)
  assert want == pytest.approx(0.489943, abs=1e-6)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(metrics["prm_loss"]) == pytest.approx(want, rel=1e-5)
  assert float(metrics["step_loss"]) == pytest.approx(
      (bce(0.9, 1.0) + bce(0.2, 0.25) + bce(0.5, 0.0)) / 3, rel=1e-5)
  # p = ½ counts as "good": (0,0) and (0,1) agree, (1,0) does not.
  assert float(metrics["step_accuracy"]) == pytest.approx(2 / 3)
  assert float(metrics["value_abs_error"]) == pytest.approx(0.0, abs=1e-7)


def test_prm_loss_hard_targets_and_value_weight():
  targets = [[1, 0, 1], [0, 1, 1]]
  loss, _ = _loss(targets, value_weight=0.5)
  steps = bce(0.9, 1) + bce(0.2, 0) + bce(0.5, 0)
  assert float(loss) == pytest.approx((steps + 0.5 * math.log(2)) / 3.5,
                                      rel=1e-5)
  loss, _ = _loss(targets, value_weight=0.0)
  assert float(loss) == pytest.approx(steps / 3, rel=1e-5)
  # No known V: the value term vanishes whatever its weight.
  loss, _ = _loss(targets, value_weight=3.0, v_mask=(0, 0))
  assert float(loss) == pytest.approx(steps / 3, rel=1e-5)


def test_prm_loss_ignores_masked_steps():
  base, _ = _loss([[1, 0, 1], [0, 1, 1]], value_weight=1.0)
  other_p = [[0.9, 0.2, 0.01], [0.5, 0.99, 0.42]]
  changed, _ = _loss([[1, 0, 0], [0, 0, 0.3]], value_weight=1.0, p=other_p)
  assert float(changed) == pytest.approx(float(base), rel=1e-6)


def test_prm_loss_class_balance_hand_computed():
  # Labelled: one positive, two negatives -> weights 3/2 and 3/4.
  loss, _ = _loss([[1, 0, 1], [0, 1, 1]], value_weight=0.5, balance=True)
  want = (1.5 * bce(0.9, 1) + 0.75 * bce(0.2, 0) + 0.75 * bce(0.5, 0) +
          0.5 * bce(0.5, 0.5)) / (1.5 + 0.75 + 0.75 + 0.5)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  weights = training.class_balance_weights(
      jnp.asarray([[1.0, 0.0, 1.0, 0.0]]), jnp.asarray([[1, 1, 1, 0]]))
  np.testing.assert_allclose(weights, [[0.75, 1.5, 0.75, 0.0]])
  # One class only: weights stay 1.
  weights = training.class_balance_weights(jnp.asarray([[1.0, 0.6]]),
                                           jnp.asarray([[1, 1]]))
  np.testing.assert_allclose(weights, [[1.0, 1.0]])


def test_log_probs_from_log_p():
  log_p, log_not_p = training.log_probs_from_log_p(jnp.log(
      jnp.asarray([0.25, 1.0])))
  np.testing.assert_allclose(np.exp(log_p), [0.25, 1.0], rtol=1e-5)
  np.testing.assert_allclose(log_not_p[0], math.log(0.75), rtol=1e-5)
  assert np.isfinite(log_not_p[1])  # p = 1 clamped below 1.


# --------------------------------------------------------- label arrays ---

P1 = arith.problem_from_chain(23, "+-+", [7, 9, 34])   # 23, 30, 21, 55.
NUM_STEPS = 4


@pytest.fixture(scope="module")
def task():
  return tasks_lib.ArithTask(config_lib.base_config().task, 0)


def _record(task, text, *, q, hard, v, oracle, first_error, outcome, index):
  tokenizer = task.tokenizer
  return {
      "split": "train", "index": index, "question": P1.question,
      "prompt_ids": labels.response_rows(*task.encode_prompts([P1]))[0],
      "response_ids": tokenizer.encode(text) + [tokenizer.eos_id],
      "text": text, "finished": True, "outcome": outcome, "q": q,
      "hard": hard, "rollouts": [4] * (len(q) - 1) + [0], "v": v,
      "v_rollouts": 4, "oracle": oracle, "first_error": first_error}


@pytest.fixture(scope="module")
def records(task):
  return [
      _record(task, "023+07=030\n030-09=021\n021+34=055\n#055",
              q=[0.5, 0.25, None, 1.0], hard=[1, 1, 1, 1], v=0.75,
              oracle=[True] * 4, first_error=-1, outcome=1.0, index=0),
      _record(task, "023+07=030\n030+34=064\n#064", q=[1.0, 0.0, 0.0],
              hard=[1, 0, 0], v=None, oracle=[True, False, False],
              first_error=1, outcome=0.0, index=1),
      # Five steps in four slots: the last slot takes the final label.
      _record(task, "023+07=030\n030-09=021\n021+34=055\n#055\n#055",
              q=[0.5, 0.75, 0.25, 0.5, 1.0], hard=[1, 1, 1, 1, 1], v=0.5,
              oracle=[True, True, True, True, False], first_error=4,
              outcome=1.0, index=2),
  ]


def _arrays(task, records, **kwargs):
  return training.label_arrays(
      records, prompt_width=task.max_prompt_len,
      response_budget=task.max_new_tokens, num_steps=NUM_STEPS,
      delimiter_mask=task.delimiter_mask(), eos_id=task.tokenizer.eos_id,
      pad_id=task.tokenizer.pad_id, **kwargs)


def test_label_arrays_soft_targets_in_their_slots(task, records):
  out = _arrays(task, records, target="soft")
  np.testing.assert_allclose(out["targets"], [[0.5, 0.25, 0.0, 1.0],
                                              [1.0, 0.0, 0.0, 0.0],
                                              [0.5, 0.75, 0.25, 1.0]])
  np.testing.assert_array_equal(out["target_mask"], [[1, 1, 0, 1],
                                                     [1, 1, 1, 0],
                                                     [1, 1, 1, 1]])
  np.testing.assert_allclose(out["v_target"], [0.75, 0.0, 0.5])
  np.testing.assert_array_equal(out["v_mask"], [True, False, True])
  np.testing.assert_array_equal(out["oracle"], [[1, 1, 1, 1], [1, 0, 0, 0],
                                                [1, 1, 1, 0]])
  np.testing.assert_array_equal(out["oracle_mask"], [[1, 1, 1, 1],
                                                     [1, 1, 1, 0],
                                                     [1, 1, 1, 1]])
  np.testing.assert_array_equal(out["first_error"], [-1, 1, 4])
  np.testing.assert_array_equal(out["outcome"], [1, 0, 1])


def test_label_arrays_layout(task, records):
  out = _arrays(task, records, target="soft")
  p = task.max_prompt_len
  prompt = records[0]["prompt_ids"]
  tokens, ids = out["tokens"], out["step_ids"]
  assert tokens.shape == (3, p + task.max_new_tokens)
  np.testing.assert_array_equal(tokens[0, p - len(prompt):p], prompt)
  np.testing.assert_array_equal(out["attention_mask"][0, :p - len(prompt)], 0)
  response = records[2]["response_ids"]
  np.testing.assert_array_equal(tokens[2, p:p + len(response)], response)
  np.testing.assert_array_equal(out["response_mask"][2].sum(), len(response))
  # Row 2: lines of 11 tokens; the fourth and fifth steps share slot 3.
  np.testing.assert_array_equal(ids[2, p:p + 11], 0)
  np.testing.assert_array_equal(ids[2, p + 22:p + 33], 2)
  np.testing.assert_array_equal(ids[2, p + 33:p + len(response)], 3)
  assert (ids[2, p + len(response):] == -1).all() and (ids[:, :p] == -1).all()


def test_label_arrays_hard_progress_and_prover_targets(task, records):
  out = _arrays(task, records, target="hard")
  np.testing.assert_array_equal(out["targets"], [[1, 1, 1, 1], [1, 0, 0, 0],
                                                 [1, 1, 1, 1]])
  np.testing.assert_array_equal(out["target_mask"][1], [1, 1, 1, 0])
  # Best-of-2 prover: 1 - (1 - Q)^2 for Q and V.
  out = _arrays(task, records, target="prover", prover_k=2)
  np.testing.assert_allclose(out["targets"], [[0.75, 0.4375, 0.0, 1.0],
                                              [1.0, 0.0, 0.0, 0.0],
                                              [0.75, 0.9375, 0.4375, 1.0]])
  np.testing.assert_array_equal(out["target_mask"][0], [1, 1, 0, 1])
  np.testing.assert_allclose(out["v_target"], [0.9375, 0.0, 0.75])
  # Progress, rho = ½: row 0 (V = .75): .5 >= .375, .25 >= .25; the unknown
  # Q-hat and its successor unlabelled. Row 1 (V unknown): 0 < .5, 0 >= 0.
  out = _arrays(task, records, target="progress", progress_ratio=0.5)
  np.testing.assert_array_equal(out["targets"][:2], [[1, 1, 0, 0],
                                                     [0, 0, 1, 0]])
  np.testing.assert_array_equal(out["target_mask"][:2], [[1, 1, 0, 0],
                                                         [0, 1, 1, 0]])


def test_label_arrays_drop_after_first_negative(task, records):
  out = _arrays(task, records, target="hard", drop_after_first_negative=True)
  np.testing.assert_array_equal(out["target_mask"], [[1, 1, 1, 1],
                                                     [1, 1, 0, 0],
                                                     [1, 1, 1, 1]])
  # Soft targets stop at the first hard-negative step too.
  out = _arrays(task, records, target="soft", drop_after_first_negative=True)
  np.testing.assert_allclose(out["targets"][1], [1.0, 0.0, 0.0, 0.0])
  np.testing.assert_array_equal(out["target_mask"][1], [1, 1, 0, 0])


def test_label_arrays_errors(task, records):
  with pytest.raises(ValueError, match="target"):
    _arrays(task, records, target="nope")
  wrong = dict(records[1], hard=[1, 0], q=[1.0, 0.0], rollouts=[4, 0],
               oracle=None)
  with pytest.raises(ValueError, match="3 steps"):
    _arrays(task, [wrong])
  long = dict(records[0], response_ids=records[0]["response_ids"] * 3)
  with pytest.raises(ValueError, match="another task configuration"):
    _arrays(task, [long])


# --------------------------------------------------------- update steps ---


@pytest.mark.parametrize("model", ["head", "generative"])
def test_prm_steps_reduce_the_loss(task, records, model):
  config = models.preset("test", task.tokenizer.vocab_size)
  policy = models.init_params(config, jax.random.key(0))
  heads = ("score",) if model == "head" else ("lm", "score")
  params = models.init_from_backbone(config, policy, jax.random.key(1),
                                     heads=heads)
  # Hard targets: the loss can go to 0 (soft ones have an entropy floor).
  arrays = _arrays(task, records, target="hard")
  batch = {k: jnp.asarray(arrays[k]) for k in (
      "tokens", "attention_mask", "step_ids", "targets", "target_mask",
      "v_target", "v_mask")}
  tx = optim.make_optimizer(learning_rate=1e-2)
  step = jax.jit(training.make_prm_step(config, tx, num_steps=NUM_STEPS,
                                        model=model, value_weight=1.0))
  state = state_lib.create(params, tx)
  losses = []
  for _ in range(12):
    state, metrics = step(state, batch)
    losses.append(float(metrics["prm_loss"]))
  # The loss reported by a step is that of the parameters it starts from.
  assert all(np.isfinite(losses)) and int(state.skipped) == 0
  assert losses[-1] < 0.5 * losses[0], losses
  assert int(state.step) == 12


def test_make_prm_step_rejects_unknown_model():
  config = models.preset("test", 18)
  with pytest.raises(ValueError, match="model"):
    training.make_prm_step(config, optim.make_optimizer(learning_rate=1e-3),
                           num_steps=4, model="implicit")
