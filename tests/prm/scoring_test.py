"""Step scorers: the oracle against hand-labelled solutions; score-head,
generative and implicit PRMs against naive full-forward-pass references,
padding invariance and jit; the seeded random scorer."""

import jax
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import labels
from rl_rewards.prm import scoring
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import arith

P1 = arith.problem_from_chain(23, "+-+", [7, 9, 34])   # 23, 30, 21, 55.
P2 = arith.problem_from_chain(40, "-+", [15, 6])       # 40, 25, 31.

# (problem, response text, hand-written step labels).
HAND_LABELLED = [
    (P1, "023+07=030\n030-09=021\n021+34=055\n#055", [1, 1, 1, 1]),
    # Wrong sum in step 2; later steps start from the wrong value.
    (P1, "023+07=030\n030-09=022\n022+34=056\n#056", [1, 0, 0, 0]),
    # Wrong operand copied in step 2 (arithmetic itself right).
    (P1, "023+07=030\n030-06=024\n024+34=058\n#058", [1, 0, 0, 0]),
    # Step 2 missing: its slot holds operation 3, the answer sits in step 3.
    (P1, "023+07=030\n030+34=064\n#064", [1, 0, 0]),
    # Only the final answer wrong.
    (P1, "023+07=030\n030-09=021\n021+34=055\n#056", [1, 1, 1, 0]),
    # A step after the answer is wrong.
    (P1, "023+07=030\n030-09=021\n021+34=055\n#055\n#055", [1, 1, 1, 1, 0]),
    # Unpadded numbers are accepted; the wrong operator is not.
    (P2, "40-15=25\n25+6=31\n#31", [1, 1, 1]),
    (P2, "040+15=055\n055+06=061\n#061", [0, 0, 0]),
]


@pytest.fixture(scope="module")
def task():
  return tasks_lib.ArithTask(config_lib.base_config().task, 0)


def _batch(task, items, *, num_steps, prompt_width=None, response_budget=None,
           rows=0):
  tokenizer = task.tokenizer
  problems = [p for p, *_ in items]
  prompts = labels.response_rows(*task.encode_prompts(problems))
  responses = [tokenizer.encode(text) + [tokenizer.eos_id]
               for _, text, *_ in items]
  return scoring.make_solution_batch(
      task, problems, prompts, responses,
      prompt_width=prompt_width or task.max_prompt_len,
      response_budget=response_budget or task.max_new_tokens,
      num_steps=num_steps, rows=rows)


# ---------------------------------------------------------------- oracle ---


def test_oracle_matches_hand_labels_and_step_checker(task):
  batch = _batch(task, HAND_LABELLED, num_steps=8)
  out = scoring.OracleScorer(task).score_batch(batch)
  for b, (problem, text, want) in enumerate(HAND_LABELLED):
    k = len(want)
    assert arith.check_solution(problem, text).labels == [bool(x)
                                                          for x in want]
    np.testing.assert_array_equal(out["step_scores"][b],
                                  want + [0] * (8 - k), err_msg=text)
    np.testing.assert_array_equal(out["step_mask"][b],
                                  [True] * k + [False] * (8 - k))
  np.testing.assert_array_equal(out["v_init"], 1.0)


def test_oracle_as_value_is_one_until_first_error(task):
  batch = _batch(task, HAND_LABELLED, num_steps=8)
  out = scoring.OracleScorer(task, as_value=True).score_batch(batch)
  want = [[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0], [1, 1, 1, 0],
          [1, 1, 1, 1, 0], [1, 1, 1], [0, 0, 0]]
  for b, row in enumerate(want):
    np.testing.assert_array_equal(out["step_scores"][b],
                                  row + [0] * (8 - len(row)))


def test_oracle_merges_steps_beyond_the_slots(task):
  # S = 2: slot 1 holds steps 2.. and is right iff all of them are.
  batch = _batch(task, HAND_LABELLED, num_steps=2)
  out = scoring.OracleScorer(task).score_batch(batch)
  np.testing.assert_array_equal(
      out["step_scores"],
      [[1, 1], [1, 0], [1, 0], [1, 0], [1, 0], [1, 0], [1, 1], [0, 0]])
  assert out["step_mask"].all()


def test_oracle_first_zero_is_injected_error(task):
  # Corrupted solutions know their first wrong step from the reference
  # solution, independently of the checker.
  rng = np.random.default_rng(0)
  items, first_errors = [], []
  for i in range(30):
    problem = arith.make_problem(task.config, i, "test")
    kind = arith.CORRUPTION_KINDS[i % len(arith.CORRUPTION_KINDS)]
    corrupted = arith.corrupt_solution(problem, rng, kind)
    items.append((problem, corrupted.text))
    first_errors.append(corrupted.first_error)
  batch = _batch(task, items, num_steps=16)
  out = scoring.OracleScorer(task).score_batch(batch)
  for b, first_error in enumerate(first_errors):
    valid = out["step_scores"][b][out["step_mask"][b]]
    assert np.argmin(valid) == first_error and valid[first_error] == 0.0


def test_oracle_errors(task):
  class NoLabels:
    has_step_labels = False
  with pytest.raises(ValueError, match="step labels"):
    scoring.OracleScorer(NoLabels())
  batch = _batch(task, HAND_LABELLED[:1], num_steps=4)
  batch.texts = None
  with pytest.raises(ValueError, match="problems and texts"):
    scoring.OracleScorer(task).score_batch(batch)


# ---------------------------------------------------------------- layout ---


def test_make_solution_batch_layout(task):
  items = HAND_LABELLED[:2]
  batch = _batch(task, items, num_steps=3, rows=4)
  tokens = np.asarray(batch.tokens)
  assert tokens.shape == (4, task.max_prompt_len + task.max_new_tokens)
  # Rows 2 and 3 repeat the first solution.
  np.testing.assert_array_equal(tokens[2], tokens[0])
  np.testing.assert_array_equal(tokens[3], tokens[0])
  assert batch.texts == [items[0][1], items[1][1], items[0][1], items[0][1]]
  # Steps 0, 1 and then 2, 3 merged into slot 2 (each line: 10 chars + \n).
  p = task.max_prompt_len
  ids = np.asarray(batch.step_ids)[0]
  assert (ids[:p] == -1).all()
  np.testing.assert_array_equal(ids[p:p + 11], 0)
  np.testing.assert_array_equal(ids[p + 11:p + 22], 1)
  np.testing.assert_array_equal(ids[p + 22:p + 38], 2)  # 11 + "#055" + EOS.
  assert (ids[p + 38:] == -1).all()
  with pytest.raises(ValueError, match="rows=1"):
    _batch(task, items, num_steps=3, rows=1)
  # 27 and 38 response tokens: the second does not fit 30 slots.
  with pytest.raises(ValueError, match="solution 1"):
    _batch(task, [HAND_LABELLED[3], HAND_LABELLED[0]], num_steps=3,
           response_budget=30)


def test_solution_step_ids_end_on_any_stop_id():
  # "...#055\n" + a second stop id: the trailing newline's step takes it,
  # as it would take EOS (one step per line, 4 steps).
  task = tasks_lib.ArithTask(config_lib.base_config().task, 0)
  tokenizer = task.tokenizer
  tokenizer.stop_ids = (tokenizer.eos_id, tokenizer.pad_id)
  problems = [P1]
  prompts = labels.response_rows(*task.encode_prompts(problems))
  text = HAND_LABELLED[0][1] + "\n"
  batch = scoring.make_solution_batch(
      task, problems, prompts, [tokenizer.encode(text) + [tokenizer.pad_id]],
      prompt_width=task.max_prompt_len, response_budget=task.max_new_tokens,
      num_steps=8)
  ids = np.asarray(batch.step_ids)[0, task.max_prompt_len:]
  # 3 lines of 11 tokens, then "#055", newline and the stop id.
  np.testing.assert_array_equal(ids[:40], [0] * 11 + [1] * 11 + [2] * 11 +
                                [3] * 6 + [-1])
  assert batch.texts == [text]


def test_merge_step_labels():
  assert scoring.merge_step_labels([1, 0, 1, 1], 2) == [True, False]
  assert scoring.merge_step_labels([1, 1, 0, 1], 3) == [True, True, False]
  assert scoring.merge_step_labels([1, 1, 1], 2) == [True, True]
  assert scoring.merge_step_labels([0, 1], 4) == [False, True]


# ---------------------------------------------------------------- random ---


def test_random_scorer_is_seeded(task):
  batch = _batch(task, HAND_LABELLED, num_steps=4)
  first = scoring.RandomScorer(7).score_batch(batch)
  again = scoring.RandomScorer(7).score_batch(batch)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  other = scoring.RandomScorer(8).score_batch(batch)
  assert not np.array_equal(first["step_scores"], other["step_scores"])
  scorer = scoring.RandomScorer(7)
  scorer.score_batch(batch)
  second_draw = scorer.score_batch(batch)
  assert not np.array_equal(first["step_scores"], second_draw["step_scores"])
  counts = [min(len(w), 4) for _, _, w in HAND_LABELLED]
  np.testing.assert_array_equal(first["step_mask"].sum(1), counts)
  scores = first["step_scores"]
  assert (scores[~first["step_mask"]] == 0).all()
  valid = scores[first["step_mask"]]
  assert ((valid >= 0) & (valid < 1)).all() and len(np.unique(valid)) > 10


# ----------------------------------------------------------- model PRMs ---

NUM_STEPS = 4
# Two valid rows with 4 and 5 steps (the fifth merged into slot 3), one with
# 3 steps, one short solution (the answer only).
MODEL_ITEMS = [HAND_LABELLED[0], HAND_LABELLED[5], HAND_LABELLED[3],
               (P2, "#031", [1])]


@pytest.fixture(scope="module")
def model():
  config = models.preset("test", 18)
  params = models.init_params(config, jax.random.key(1), heads=("lm", "score"))
  other = models.init_params(config, jax.random.key(2), heads=("lm", "score"))
  return config, params, other


def _right_padded(task, items):
  """Unpadded-prefix layout for the naive reference: [prompt response PAD..]
  plus the positions of the prompt's last token and of each step's last
  token (steps beyond NUM_STEPS merged into the last slot)."""
  tokenizer = task.tokenizer
  rows, prompt_ends, step_ends = [], [], []
  for problem, text, _ in items:
    prompt = labels.response_rows(*task.encode_prompts([problem]))[0]
    response = tokenizer.encode(text) + [tokenizer.eos_id]
    newline = tokenizer.encode("\n")[0]
    ends = [i for i, t in enumerate(response[:-1]) if t == newline]
    ends = ends + [len(response) - 1]
    ends = ends[:NUM_STEPS - 1] + [ends[-1]] if len(ends) > NUM_STEPS else ends
    rows.append(prompt + response)
    prompt_ends.append(len(prompt) - 1)
    step_ends.append([len(prompt) + e for e in ends])
  width = max(len(r) for r in rows)
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, 1
  return tokens, mask, prompt_ends, step_ends


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _check_scores(out, want_steps, want_v, atol=1e-5):
  step_scores = np.asarray(out["step_scores"])
  step_mask = np.asarray(out["step_mask"])
  assert step_scores.shape == step_mask.shape == (len(want_steps), NUM_STEPS)
  for b, want in enumerate(want_steps):
    np.testing.assert_array_equal(step_mask[b], np.arange(NUM_STEPS) <
                                  len(want))
    np.testing.assert_allclose(step_scores[b, :len(want)], want, atol=atol)
    assert (step_scores[b, len(want):] == 0).all()
  valid = step_scores[step_mask]
  assert ((valid >= 0) & (valid <= 1)).all()
  np.testing.assert_allclose(out["v_init"], want_v, atol=atol)


def _padded_variants(task):
  """The same solutions in the standard layout and with 3 more prompt slots,
  5 more response slots and 2 more rows (repeating the first solution)."""
  plain = _batch(task, MODEL_ITEMS, num_steps=NUM_STEPS)
  padded = _batch(task, MODEL_ITEMS, num_steps=NUM_STEPS,
                  prompt_width=task.max_prompt_len + 3,
                  response_budget=task.max_new_tokens + 5,
                  rows=len(MODEL_ITEMS) + 2)
  return plain, padded


def _scorer_checks(task, scorer, direct, want_steps, want_v):
  plain, padded = _padded_variants(task)
  out = scorer.score_batch(plain)
  _check_scores(out, want_steps, want_v)
  # Extra left padding of the prompts, right padding of the responses and
  # extra rows leave the valid scores unchanged.
  out_padded = scorer.score_batch(padded)
  n = len(MODEL_ITEMS)
  for key in out:
    np.testing.assert_allclose(out_padded[key][:n], out[key], atol=1e-5,
                               err_msg=key)
  # The scorer's jitted function against the un-jitted score function.
  eager = direct(plain.tokens, plain.attention_mask, plain.step_ids)
  for key, value in zip(("step_scores", "step_mask", "v_init"), eager):
    np.testing.assert_allclose(np.asarray(value), out[key], atol=1e-5,
                               err_msg=key)
  # The device path the RL stage uses gives the same numbers.
  rollout = scorer.score_rollout(plain.tokens, plain.attention_mask,
                                 plain.step_ids)
  np.testing.assert_allclose(np.asarray(rollout["step_scores"]),
                             out["step_scores"], atol=1e-6)


def test_head_scores_match_naive_forward(task, model):
  config, params, _ = model
  tokens, mask, prompt_ends, step_ends = _right_padded(task, MODEL_ITEMS)
  raw, _ = models.apply(config, params, tokens, attention_mask=mask,
                        head="score")
  raw = np.asarray(raw, np.float64)
  want_steps = [_sigmoid(raw[b, ends]) for b, ends in enumerate(step_ends)]
  want_v = [_sigmoid(raw[b, e]) for b, e in enumerate(prompt_ends)]
  scorer = scoring.head_scorer(config, params, NUM_STEPS)
  direct = lambda t, m, s: scoring.head_step_scores(config, params, t, m, s,
                                                    NUM_STEPS)
  _scorer_checks(task, scorer, direct, want_steps, want_v)


def _token_logprobs(config, params, tokens, mask):
  """log π(y_t | y_<t) at every position t >= 1 (row-wise, numpy)."""
  logits, _ = models.apply(config, params, tokens, attention_mask=mask)
  logits = np.asarray(logits, np.float64)
  out = np.zeros(tokens.shape)
  for b in range(tokens.shape[0]):
    for t in range(1, int(mask[b].sum())):
      row = logits[b, t - 1]
      out[b, t] = row[tokens[b, t]] - (row.max() + np.log(
          np.exp(row - row.max()).sum()))
  return out


def test_generative_scores_match_naive_forward(task, model):
  config, params, _ = model
  tokens, mask, prompt_ends, step_ends = _right_padded(task, MODEL_ITEMS)
  logp = _token_logprobs(config, params, tokens, mask)
  raw, _ = models.apply(config, params, tokens, attention_mask=mask,
                        head="score")
  want_steps = []
  for b, ends in enumerate(step_ends):
    starts = [prompt_ends[b] + 1] + [e + 1 for e in ends[:-1]]
    want_steps.append([np.exp(sum(logp[b, t] for t in range(s, e + 1)))
                       for s, e in zip(starts, ends)])
  want_v = [_sigmoid(np.asarray(raw)[b, e]) for b, e in enumerate(prompt_ends)]
  scorer = scoring.generative_scorer(config, params, NUM_STEPS)
  direct = lambda t, m, s: scoring.generative_step_scores(
      config, params, t, m, s, NUM_STEPS)
  _scorer_checks(task, scorer, direct, want_steps, want_v)


def test_implicit_scores_are_summed_beta_log_ratios(task, model):
  config, params, reference = model
  beta = 0.5
  tokens, mask, prompt_ends, step_ends = _right_padded(task, MODEL_ITEMS)
  ratio = (_token_logprobs(config, params, tokens, mask) -
           _token_logprobs(config, reference, tokens, mask))
  want_steps = []
  for b, ends in enumerate(step_ends):
    # Per step: beta * the log-ratios of its tokens; the score is σ of the
    # sum over the steps so far (the soft Q-value at the step's end).
    starts = [prompt_ends[b] + 1] + [e + 1 for e in ends[:-1]]
    rewards = [beta * sum(ratio[b, t] for t in range(s, e + 1))
               for s, e in zip(starts, ends)]
    want_steps.append(_sigmoid(np.cumsum(rewards)))
  scorer = scoring.implicit_scorer(config, params, reference, NUM_STEPS,
                                   beta=beta)
  direct = lambda t, m, s: scoring.implicit_step_scores(
      config, params, reference, t, m, s, NUM_STEPS, beta=beta)
  _scorer_checks(task, scorer, direct, want_steps, [0.5] * len(MODEL_ITEMS))


def test_implicit_scores_neutral_when_params_equal_reference(task, model):
  config, params, _ = model
  scorer = scoring.implicit_scorer(config, params, params, NUM_STEPS,
                                   beta=0.5)
  out = scorer.score_batch(_batch(task, MODEL_ITEMS, num_steps=NUM_STEPS))
  assert (out["step_scores"][out["step_mask"]] == 0.5).all()
  assert (out["step_scores"][~out["step_mask"]] == 0.0).all()
  assert (out["v_init"] == 0.5).all()


def test_model_scorer_checks_step_slots(task, model):
  config, params, _ = model
  scorer = scoring.head_scorer(config, params, NUM_STEPS)
  with pytest.raises(ValueError, match="step slots"):
    scorer.score_batch(_batch(task, MODEL_ITEMS, num_steps=NUM_STEPS + 1))


@pytest.mark.parametrize("kind", ["head", "generative", "implicit"])
def test_micro_batched_scoring_equals_whole_batch(task, model, kind):
  config, params, reference = model
  make = {
      "head": lambda **kw: scoring.head_scorer(
          config, params, NUM_STEPS,
          **{k: v for k, v in kw.items() if k != "chunk_size"}),
      "generative": lambda **kw: scoring.generative_scorer(
          config, params, NUM_STEPS, **kw),
      "implicit": lambda **kw: scoring.implicit_scorer(
          config, params, reference, NUM_STEPS, beta=0.5, **kw),
  }[kind]
  _, batch = _padded_variants(task)      # 6 rows
  whole = make().score_batch(batch)
  # 2-row micro-batches divide the batch; 4-row ones pad it to 8 rows. The
  # LM head in chunks of 5 positions.
  for rows in (2, 4):
    scorer = make(micro_batch_size=rows, chunk_size=5)
    out = scorer.score_batch(batch)
    for key in whole:
      np.testing.assert_allclose(out[key], whole[key], atol=1e-6,
                                 err_msg=f"{key}, {rows} rows")
    rollout = scorer.score_rollout(batch.tokens, batch.attention_mask,
                                   batch.step_ids)
    np.testing.assert_allclose(np.asarray(rollout["step_scores"]),
                               whole["step_scores"], atol=1e-6)
