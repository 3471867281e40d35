"""Monte-Carlo step labels, progress labels and OmegaPRM's binary search.

The rollouts run through the real sampler (the `PolicySampler` the labels
stage builds, on the run's mesh) with `test`-size decoders whose outcomes are
known by construction: a bigram decoder whose next token after a newline is
EOS, so a prefix is completed correctly iff its last step is the right answer
line, and a randomly initialised decoder decoded greedily, whose rollouts are
checked against a naive full-forward-pass greedy decoder. The binary search
runs with a scripted policy that finishes any error-free prefix correctly.
"""

import math

import jax
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import config_presets
from rl_rewards import models
from rl_rewards.prm import labels
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages
from rl_rewards.tasks import arith

from . import fakes

# Two problems: 23+7-9+34 (values 23, 30, 21, 55) and 40-15+6 (40, 25, 31).
P1 = arith.problem_from_chain(23, "+-+", [7, 9, 34], split="train", index=0)
P2 = arith.problem_from_chain(40, "-+", [15, 6], split="train", index=1)


# ------------------------------------------------------ counts -> labels ---


def test_math_shepherd_labels_hand_counts():
  soft, hard = labels.math_shepherd_labels([0, 1, 3, 4, 2], [4, 4, 4, 4, 8])
  np.testing.assert_array_equal(soft, [0.0, 0.25, 0.75, 1.0, 0.25])
  np.testing.assert_array_equal(hard, [0.0, 1.0, 1.0, 1.0, 1.0])
  assert soft.dtype == np.float32 and hard.dtype == np.float32


@pytest.mark.parametrize("correct,total", [([5], [4]), ([-1], [4]),
                                           ([0], [0])])
def test_math_shepherd_labels_reject_bad_counts(correct, total):
  with pytest.raises(ValueError, match="correct"):
    labels.math_shepherd_labels(correct, total)


def test_progress_labels_hand_computed():
  # 1[Q_k >= 0.5 * Q_{k-1}], Q_{-1} = V = 0.6:
  # 0.5 >= 0.3 -> 1; 0.2 >= 0.25 -> 0; 0.2 >= 0.1 -> 1; 0.0 >= 0.1 -> 0.
  out = labels.progress_labels([0.5, 0.2, 0.2, 0.0], 0.6, ratio=0.5)
  np.testing.assert_array_equal(out, [1, 0, 1, 0])
  # ratio 1: any loss of success probability is negative; equal is not.
  np.testing.assert_array_equal(
      labels.progress_labels([0.5, 0.5, 0.4], 0.5, ratio=1.0), [1, 1, 0])
  # Zero predecessor: every step is non-negative progress.
  np.testing.assert_array_equal(labels.progress_labels([0.0], 0.0), [1])


def test_progress_labels_unknown_values_are_nan():
  out = labels.progress_labels([np.nan, 0.4, 0.1], 0.5)
  assert np.isnan(out[0]) and np.isnan(out[1]) and out[2] == 0.0
  out = labels.progress_labels([0.3, 0.3], np.nan)
  assert np.isnan(out[0]) and out[1] == 1.0


# -------------------------------------------------------- binary search ---


def _run_search(num_steps, first_error):
  """Runs BinarySearch against monotone verdicts; returns (result, probes).

  Prefix x_{1:j} is good (some continuation correct) iff j <= first_error.
  """
  search = labels.BinarySearch(num_steps)
  probes = []
  while not search.done:
    mid = search.probe()
    probes.append(mid)
    if len(probes) > num_steps:  # A search that never ends fails the test.
      break
    search.update(mid <= first_error)
  return search.first_error, probes


@pytest.mark.parametrize("num_steps", list(range(1, 14)) + [16, 17, 31])
def test_binary_search_finds_first_error(num_steps):
  bound = math.ceil(math.log2(num_steps)) if num_steps > 1 else 0
  for first_error in range(num_steps):
    found, probes = _run_search(num_steps, first_error)
    assert found == first_error, (num_steps, first_error, probes)
    assert len(probes) <= bound, (num_steps, first_error, probes)
    assert len(set(probes)) == len(probes)


def test_binary_search_edge_cases():
  # First step wrong: every probe is bad, hi walks down to 1.
  assert _run_search(8, 0) == (0, [4, 2, 1])
  # Every step before the last right (e.g. only the answer is wrong).
  assert _run_search(8, 7) == (7, [4, 6, 7])
  # A single step needs no probe: it is the error.
  assert _run_search(1, 0) == (0, [])
  with pytest.raises(ValueError, match="num_steps"):
    labels.BinarySearch(0)


# ------------------------------------------------------ policy sampler ---


def test_policy_sampler_skips_padding_rows_and_stops_on_any_stop_id():
  # A bigram decoder over 18 tokenizer ids + 2 embedding padding rows whose
  # logits favour padding id 19, then EOS (2), then token 5.
  vocab, tokens = 20, 18
  config = models.preset("test", vocab)
  table = np.full((vocab, vocab), -100.0, np.float32)
  table[:, 19], table[:, 2], table[:, 5] = 0.0, -1.0, -2.0
  params = fakes.bigram_params(config, table)
  prompts, mask = np.array([[1, 7]], np.int32), np.ones((1, 2), np.int32)
  def run(**kwargs):
    sampler = labels.PolicySampler(config, params, pad_id=0,
                                   delimiter_mask=np.zeros(vocab, bool),
                                   max_new_tokens=4, temperature=0.0,
                                   **kwargs)
    out = sampler.sample(prompts, mask, jax.random.key(0))
    return out["tokens"][0, 2:].tolist(), out["truncated"][0]
  assert run(eos_id=2) == ([19, 19, 19, 19], True)
  assert run(eos_id=2, num_tokens=tokens) == ([2, 0, 0, 0], False)
  # Without EOS among the stop ids the row runs on token 5, a stop id.
  table[:, 2] = -100.0
  params = fakes.bigram_params(config, table)
  assert run(eos_id=(3, 5), num_tokens=tokens) == ([5, 0, 0, 0], False)


# ------------------------------------------------- hand-made solutions ---


def _solution(task, problem, text, *, finished=True):
  """A `Solution` from response text (EOS appended when finished)."""
  tokenizer = task.tokenizer
  prompt_ids = labels.response_rows(*task.encode_prompts([problem]))[0]
  response = tokenizer.encode(text) + ([tokenizer.eos_id] if finished else [])
  newline = tokenizer.encode("\n")[0]
  ends = [i for i, t in enumerate(response) if t == newline]
  if finished and ends and ends[-1] == len(response) - 2:
    ends.pop()  # "...\n<EOS>": the EOS joins the step the newline closes.
  if not ends or ends[-1] != len(response) - 1:
    ends.append(len(response) - 1)
  return labels.Solution(
      problem=problem, split=problem.split, index=problem.index,
      prompt_ids=prompt_ids, response_ids=response, step_ends=ends,
      finished=finished, outcome=arith.outcome_reward(problem, text, finished),
      text=text)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
  config = config_presets.apply_size(config_lib.base_config(), "test")
  return pipeline.build_context(config, str(tmp_path_factory.mktemp("ctx")))


def _transitions(vocab_size, newline, eos, p_eos_after_newline):
  """Bigram logits: EOS after every token; after a newline EOS with the
  given probability (1 or 1/2) and otherwise another newline."""
  table = np.full((vocab_size, vocab_size), -100.0, np.float32)
  table[:, eos] = 0.0
  if p_eos_after_newline < 1:
    assert p_eos_after_newline == 0.5
    table[newline, newline] = 0.0
  return table


def _bigram_prover(ctx, p_eos_after_newline):
  tokenizer = ctx.task.tokenizer
  params = fakes.bigram_params(
      ctx.model_config,
      _transitions(ctx.model_config.vocab_size, tokenizer.encode("\n")[0],
                   tokenizer.eos_id, p_eos_after_newline))
  params = context_lib.place_params(ctx, params)
  return fakes.RecordingSampler(
      prm_stages.policy_sampler(ctx, params, temperature=1.0))


# Response texts, their expected Q-hat under the "newline -> EOS" prover (a
# prefix is right iff its last step is the right answer line; the last step's
# label is the solution's own outcome) and the number of new prefixes.
SOLUTIONS = [
    (P1, "023+07=030\n#055\n030-09=021\n#055", True, [0, 1, 0, 1]),
    (P1, "023+07=030\n030-09=021\n021+34=055\n#055", True, [0, 0, 0, 1]),
    (P1, "#055\n#055", True, [1, 1]),
    (P2, "#031\n#030", True, [1, 0]),
    # The same solution again: its prefixes are rolled out once.
    (P1, "023+07=030\n030-09=021\n021+34=055\n#055", True, [0, 0, 0, 1]),
    # Unfinished: the last label is the outcome (0), not a rollout (1).
    (P1, "023+07=030\n#055\n", False, [0, 0]),
]
# Unique (problem, prefix) pairs: P1 "", S1 x3, S2 x2 new, S3 x1; P2 "", x1.
NUM_PREFIXES = 9


def _label(ctx, prover, solutions, num_rollouts, batch_size, rng=0):
  task = ctx.task
  return labels.monte_carlo_labels(
      prover, task, solutions, num_rollouts=num_rollouts,
      rng=jax.random.key(rng), batch_size=batch_size,
      prompt_width=task.max_prompt_len, response_budget=task.max_new_tokens)


def test_mc_labels_deterministic_prover_gives_exact_zero_one(ctx):
  prover = _bigram_prover(ctx, 1.0)
  solutions = [_solution(ctx.task, p, t, finished=f)
               for p, t, f, _ in SOLUTIONS]
  records, stats = _label(ctx, prover, solutions, num_rollouts=4,
                          batch_size=3)
  for (_, text, _, want), record in zip(SOLUTIONS, records):
    assert record["q"] == want, text
    assert record["hard"] == [float(q > 0) for q in want], text
    assert record["rollouts"] == [4] * (len(want) - 1) + [0]
    assert record["v"] == 0.0 and record["v_rollouts"] == 4
  # Every unique prefix is rolled out once, m times, in full batches.
  assert stats["prefixes"] == NUM_PREFIXES
  assert stats["rollouts"] == NUM_PREFIXES * 4
  assert stats["generated_tokens"] == NUM_PREFIXES * 4  # One EOS each.
  assert len(prover.calls) == NUM_PREFIXES // 3
  rows = [tuple(row[m.astype(bool)]) for call in prover.calls
          for row, m in zip(call["tokens"], call["mask"])]
  assert len(set(rows)) == NUM_PREFIXES


def _recount(ctx, prover, solutions, num_rollouts):
  """Correct continuations of each rolled-out prefix, counted from the
  sampler's recorded outputs: {(prompt + prefix tokens): count}."""
  task, budget = ctx.task, ctx.task.max_new_tokens
  problems = {tuple(s.prompt_ids): s.problem for s in solutions}
  counts = {}
  for call in prover.calls:
    out = call["out"]
    for r, (row, m) in enumerate(zip(call["tokens"], call["mask"])):
      key = tuple(int(t) for t in row[m.astype(bool)])
      if key in counts:
        continue  # A padding row repeating an earlier prefix.
      prompt_len = next(len(p) for p in problems if key[:len(p)] == p)
      problem = problems[key[:prompt_len]]
      prefix = list(key[prompt_len:])
      total = 0
      for s in range(num_rollouts):
        i = r * num_rollouts + s
        cont = out["tokens"][i][out["response_mask"][i].astype(bool)].tolist()
        ids = prefix + cont
        finished = not out["truncated"][i] and len(ids) <= budget
        text = task.tokenizer.decode(ids)
        total += arith.outcome_reward(problem, text, finished)
      counts[key] = total
  return counts


def test_mc_labels_equal_correct_fraction_of_rollouts(ctx):
  # After a newline the prover writes EOS or another newline (p = 1/2 each),
  # so a prefix ending with the right answer is completed correctly with
  # probability 1/2 and any other prefix never.
  prover = _bigram_prover(ctx, 0.5)
  m = 8
  solutions = [_solution(ctx.task, p, t, finished=f)
               for p, t, f, _ in SOLUTIONS]
  records, stats = _label(ctx, prover, solutions, num_rollouts=m,
                          batch_size=4, rng=1)
  counts = _recount(ctx, prover, solutions, m)
  assert len(counts) == NUM_PREFIXES == stats["prefixes"]
  positive = []
  for (_, text, _, want), solution, record in zip(SOLUTIONS, solutions,
                                                  records):
    q, hard = record["q"], record["hard"]
    assert len(q) == len(hard) == solution.num_steps
    for k in range(solution.num_steps - 1):
      key = tuple(solution.prompt_ids) + solution.prefix(k + 1)
      assert q[k] == counts[key] / m, (text, k)
      assert 0.0 <= q[k] <= 1.0
      assert hard[k] == float(counts[key] > 0)
      if want[k] == 0:
        assert q[k] == 0.0, (text, k)
      else:
        positive.append(q[k])
    assert q[-1] == solution.outcome and hard[-1] == float(solution.outcome)
    assert record["v"] == counts[tuple(solution.prompt_ids)] / m == 0.0
  # 3 distinct positive prefixes x 8 rollouts of a fair coin.
  assert len(positive) == 3
  assert 0.2 <= np.mean(positive) <= 0.8
  assert stats["generated_tokens"] == sum(
      int(call["out"]["lengths"][:len(call["tokens"]) * m].sum())
      for call in prover.calls) - _padding_tokens(prover, m)


def _padding_tokens(prover, m):
  """Tokens sampled for the padding rows of the last (partial) batch."""
  total, seen = 0, set()
  for call in prover.calls:
    for r, (row, mask) in enumerate(zip(call["tokens"], call["mask"])):
      key = tuple(row[mask.astype(bool)])
      if key in seen:
        total += int(call["out"]["lengths"][r * m:(r + 1) * m].sum())
      seen.add(key)
  return total


def _greedy_reference(model_config, params, prompts, budget, eos_id):
  """Greedy continuations by full forward passes (no cache, no padding on
  the left): the naive reference for the sampler's cached decoding."""
  width = max(len(p) for p in prompts) + budget
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros((len(prompts), width), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
    mask[i, :len(p)] = 1
  lengths = np.array([len(p) for p in prompts])
  out = [[] for _ in prompts]
  done = np.zeros(len(prompts), bool)
  for _ in range(budget):
    logits, _ = models.apply(model_config, params, tokens,
                             attention_mask=mask)
    nxt = np.asarray(logits)[np.arange(len(prompts)), lengths - 1].argmax(-1)
    for i in range(len(prompts)):
      if not done[i]:
        out[i].append(int(nxt[i]))
        done[i] = nxt[i] == eos_id
        tokens[i, lengths[i]] = nxt[i]
        mask[i, lengths[i]] = 1
        lengths[i] += 1
    if done.all():
      break
  return out


def test_mc_rollouts_reuse_prefix_cache_exactly(ctx):
  # A randomly initialised decoder decoded greedily: every one of the m
  # continuations of a prefix (one prefill, its cache tiled m times, rows of
  # other prefixes in the same batch) equals the uncached greedy decoding of
  # that prefix alone, and the prefix's Q-hat is exactly 0 or 1.
  params = models.init_params(ctx.model_config, jax.random.key(3))
  prover = fakes.RecordingSampler(prm_stages.policy_sampler(
      ctx, context_lib.place_params(ctx, params), temperature=0.0))
  m = 3
  solutions = [_solution(ctx.task, p, t, finished=f)
               for p, t, f, _ in SOLUTIONS]
  records, _ = _label(ctx, prover, solutions, num_rollouts=m, batch_size=4)
  prefixes, continuations = [], []
  for call in prover.calls:
    out = call["out"]
    for r, (row, mask) in enumerate(zip(call["tokens"], call["mask"])):
      prefixes.append([int(t) for t in row[mask.astype(bool)]])
      rows = [out["tokens"][i][out["response_mask"][i].astype(bool)].tolist()
              for i in range(r * m, (r + 1) * m)]
      assert all(c == rows[0] for c in rows), r
      continuations.append(rows[0])
  budget = ctx.task.max_new_tokens
  want = _greedy_reference(ctx.model_config, params, prefixes, budget,
                           ctx.task.tokenizer.eos_id)
  assert continuations == want
  for record in records:
    assert all(q in (0.0, 1.0) for q in record["q"][:-1])
    assert record["hard"][:-1] == record["q"][:-1]


# ------------------------------------------------- binary search labels ---

# Hand-written solutions of P1 (and one of P2) with their first wrong step.
FAULTY = [
    ("023+07=030\n030-09=021\n021+34=055\n#055", P1, -1),  # Right.
    ("023+07=030\n030-09=022\n022+34=056\n#056", P1, 1),   # Wrong sum.
    ("023+08=031\n031-09=022\n022+34=056\n#056", P1, 0),   # Wrong operand.
    ("023+07=030\n030+34=064\n#064", P1, 1),               # Missing step.
    ("023+07=030\n030-09=021\n021+34=055\n#056", P1, 3),   # Wrong answer.
    ("040-15=025\n025+06=031\n#031", P2, -1),
    ("040-15=026\n026+06=032\n#032", P2, 0),
    ("040-15=025\n025+06=031\n#013", P2, 2),
]


def test_binary_search_labels_agree_with_mc_first_error(ctx):
  # A prover that finishes every prefix correctly from its last value: a
  # prefix is good iff it has no error yet (outcomes are deterministic).
  task = ctx.task
  prover = fakes.ScriptedPolicy(task.tokenizer, p_correct=1.0,
                                max_new_tokens=task.max_new_tokens)
  solutions = [_solution(task, p, t) for t, p, _ in FAULTY]
  for (text, problem, first_error), s in zip(FAULTY, solutions):
    assert arith.check_solution(problem, text).first_error == first_error
  kwargs = dict(num_rollouts=2, rng=jax.random.key(0), batch_size=8,
                prompt_width=task.max_prompt_len,
                response_budget=task.max_new_tokens)
  mc, mc_stats = labels.monte_carlo_labels(prover, task, solutions, **kwargs)
  bs, bs_stats = labels.binary_search_labels(prover, task, solutions,
                                             **kwargs)
  probes = 0
  for (text, _, first_error), s, a, b in zip(FAULTY, solutions, mc, bs):
    k = s.num_steps
    want = [1.0] * k if first_error < 0 else (
        [1.0] * first_error + [0.0] * (k - first_error))
    assert a["hard"] == want, text
    assert a["q"] == want, text
    assert b["hard"] == want, text
    assert a["v"] == b["v"] == 1.0
    # Binary search: Q-hat only at the probed prefixes, the outcome last.
    assert b["q"][-1] == s.outcome
    probed = [j for j in range(k - 1) if b["rollouts"][j]]
    for j in range(k - 1):
      if j in probed:
        assert b["q"][j] == want[j], (text, j)
      else:
        assert math.isnan(b["q"][j]), (text, j)
    if first_error < 0:
      assert not probed  # A correct solution needs no search.
    else:
      assert len(probed) <= math.ceil(math.log2(k))
    probes += len(probed)
  # Roots (V-hat of each problem's solutions, deduplicated per problem) plus
  # the probes, cheaper than every prefix of every solution.
  assert bs_stats["prefixes"] <= 2 + probes
  assert bs_stats["prefixes"] < mc_stats["prefixes"]
