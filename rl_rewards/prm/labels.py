"""Monte-Carlo step labels from prover rollouts (Math-Shepherd, PAV, OmegaPRM).

For a sampled solution with steps a_1..a_K (the segmentation module's token
rule), the prefix through step k is the prompt plus the response tokens up to
step k's last token. A prover policy μ continues each prefix m times; the
continuation is correct when it finishes within the response budget and the
task's verifier accepts the whole response. Then (docs/algorithms.md, "PRM
labels"):

  Q̂_k = c_k / m                 soft label (Math-Shepherd SE; PAV's target)
  hard_k = 1[c_k > 0]           hard label (Math-Shepherd HE, threshold 0)
  V̂ = Q̂ of the empty prefix    value of the bare question

The last step needs no rollouts: its prefix is the whole response, so
Q̂_K = hard_K = the outcome reward. Identical prefixes (same problem, same
tokens, which is common for the first steps) are rolled out once. Prefixes
are continued through the jitted sampler in fixed-shape batches, each
prefix prefilled once and its KV cache tiled for its m continuations
(`num_samples=m`); batches are formed from prefixes with similar remaining
length, so that the decoding loop, which stops when every row has finished,
runs as few steps as possible.

`binary_search_labels` is OmegaPRM's alternative: for a wrong
solution it probes the midpoint prefix x_{1:mid} of the interval (lo, hi]
known to hold the first error (lo = 0 good, hi = K bad), keeps the half
whose verdict (any correct rollout?) locates the error, and stops after
⌈log2 K⌉ probes; steps before the first error are labelled 1, the rest 0,
and Q̂ is known only at the probed prefixes (NaN elsewhere).

The prover can be the policy itself, Best-of-K of it (labels Q̂^π are
stored, and Q^BoK = 1 − (1 − Q̂^π)^K is derived from them where needed, which
is exact for a Best-of-K prover and K times cheaper than rolling it out), or
another checkpoint.

Multi-turn episodes are labelled per turn (`label_episodes`, below): the
prefix through turn k with its observation is continued by prover episodes,
the environment restored by replaying the prefix's turns.
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from rl_rewards import errors
from rl_rewards import progress
from rl_rewards.rollout import sampler as sampler_lib


def math_shepherd_labels(correct, total):
  """Soft and hard labels from rollout counts (Math-Shepherd SE and HE).

  Args:
    correct: [...] number of correct continuations c.
    total: [...] number of continuations m (> 0).

  Returns:
    (soft c / m, hard 1[c > 0]) as float32 arrays.
  """
  correct = np.asarray(correct, np.float64)
  total = np.asarray(total, np.float64)
  if np.any(total <= 0) or np.any(correct < 0) or np.any(correct > total):
    raise ValueError(f"need 0 <= correct <= total and total > 0, got correct="
                     f"{correct} total={total}.")
  return ((correct / total).astype(np.float32),
          (correct > 0).astype(np.float32))


def progress_labels(q, v, ratio: float = 0.5) -> np.ndarray:
  """Step labels from progress: 1[Q̂_k ≥ ρ·Q̂_{k−1}], with Q̂_{−1} = V̂.

  A step is negative when it loses more than a fraction 1 − ρ of the success
  probability of the prefix before it (PAV's progress A_k = Q_k − Q_{k−1},
  thresholded relative to Q_{k−1}). Unlike 1[Q̂_k > 0], this stays negative
  on a wrong step from which the policy sometimes recovers by a second,
  compensating mistake. NaN where Q̂_k or its predecessor is unknown.

  Args:
    q: [K] Q̂ of the prefix through each step (NaN: unknown).
    v: V̂ of the question (NaN: unknown).
    ratio: ρ in (0, 1].

  Returns:
    [K] float64 labels in {0, 1} or NaN.
  """
  q = np.asarray(q, np.float64)
  previous = np.concatenate([[v], q[:-1]])
  out = (q >= ratio * previous).astype(np.float64)
  return np.where(np.isnan(q) | np.isnan(previous), np.nan, out)


@dataclasses.dataclass
class Solution:
  """A sampled solution to label (host data).

  Attributes:
    problem: the task problem.
    split: the problem's split.
    index: its index in the split's stream.
    prompt_ids: the real prompt tokens (BOS + formatted question).
    response_ids: the generated tokens (EOS included when finished).
    step_ends: positions in `response_ids` of each step's last token.
    finished: ended with EOS within the budget.
    outcome: the verifier's reward (1.0 / 0.0).
    text: the decoded response.
  """
  problem: Any
  split: str
  index: int
  prompt_ids: list
  response_ids: list
  step_ends: list
  finished: bool
  outcome: float
  text: str

  @property
  def num_steps(self) -> int:
    return len(self.step_ends)

  def prefix(self, num_steps: int) -> tuple:
    """Response tokens of the prefix through `num_steps` steps."""
    if num_steps == 0:
      return ()
    return tuple(self.response_ids[:self.step_ends[num_steps - 1] + 1])


class PolicySampler:
  """Samples continuations of (left-padded) prefixes with a fixed policy.

  Rows are padded to a multiple of `row_multiple` (the mesh's data-parallel
  size) and placed with `place` (e.g. `mesh.put_batch`), so every call with
  the same number of rows reuses one compiled sampler.
  """

  def __init__(self, model_config, params, *, eos_id, pad_id: int,
               delimiter_mask, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, place: Optional[Callable] = None,
               to_host: Optional[Callable] = None, row_multiple: int = 1,
               num_tokens: Optional[int] = None):
    self.model_config = model_config
    self.params = params
    # An id or a sequence of ids that end a row (`Tokenizer.stop_ids`).
    self.eos_id = eos_id
    # The tokenizer's vocabulary; embedding rows past it are never sampled.
    self.num_tokens = num_tokens
    self.pad_id = pad_id
    self.delimiter_mask = np.asarray(delimiter_mask, bool)
    self.max_new_tokens = int(max_new_tokens)
    self.temperature = temperature
    self.top_p = top_p
    self._place = place or (lambda x: x)
    self._to_host = to_host or jax.device_get
    self.row_multiple = max(int(row_multiple), 1)

  def sample(self, tokens, mask, rng, *, num_samples: int = 1,
             max_new_tokens: Optional[int] = None, stop_mask=None) -> dict:
    """Samples `num_samples` continuations per row; returns host arrays.

    Args:
      tokens: [R, W] left-padded int32 prompts (prefixes).
      mask: [R, W] 1 on real tokens.
      rng: PRNG key.
      num_samples: continuations per row (rows stay prompt-major).
      max_new_tokens: new-token slots (default: the sampler's budget).
      stop_mask: optional bool [V] of tokens that also end a row.

    Returns:
      dict of numpy arrays for the R·num_samples continuations: `tokens`,
      `response_mask`, `step_ids`, `lengths`, `truncated`, `stopped` (width
      W + new tokens).
    """
    tokens = np.asarray(tokens, np.int32)
    mask = np.asarray(mask, np.int32)
    rows = tokens.shape[0]
    padded = -(-rows // self.row_multiple) * self.row_multiple
    if padded != rows:
      extra = padded - rows
      tokens = np.concatenate([tokens, np.repeat(tokens[:1], extra, 0)])
      mask = np.concatenate([mask, np.repeat(mask[:1], extra, 0)])
    tokens, mask = self._place((tokens, mask))
    out = sampler_lib.sample(
        self.model_config, self.params, tokens, mask, rng,
        max_new_tokens=max_new_tokens or self.max_new_tokens,
        temperature=self.temperature, top_p=self.top_p, eos_id=self.eos_id,
        pad_id=self.pad_id, delimiter_mask=self.delimiter_mask,
        num_samples=num_samples, stop_mask=stop_mask,
        num_tokens=self.num_tokens)
    host = self._to_host({
        "tokens": out.tokens, "response_mask": out.response_mask,
        "step_ids": out.step_ids, "lengths": out.lengths,
        "truncated": out.truncated, "stopped": out.stopped})
    keep = rows * num_samples
    return {k: np.asarray(v)[:keep] for k, v in host.items()}


def left_pad(sequences: Sequence[Sequence[int]], width: int, pad_id: int):
  """Left-padded [N, width] int32 tokens and mask from token lists."""
  tokens = np.full((len(sequences), width), pad_id, np.int32)
  mask = np.zeros((len(sequences), width), np.int32)
  for i, seq in enumerate(sequences):
    if len(seq) > width:
      raise ValueError(f"sequence {i} has {len(seq)} tokens, more than the "
                       f"width {width}.")
    if seq:
      tokens[i, width - len(seq):] = seq
      mask[i, width - len(seq):] = 1
  return tokens, mask


def response_rows(tokens, response_mask):
  """Lists of response token ids of sampled rows."""
  return [row[m.astype(bool)].tolist() for row, m in zip(tokens, response_mask)]


def step_ends_from_ids(step_ids_row, response_mask_row) -> list:
  """Positions (within the response) of each step's last token."""
  ids = np.asarray(step_ids_row)[np.asarray(response_mask_row).astype(bool)]
  if ids.size == 0:
    return []
  ends = np.nonzero(ids != np.append(ids[1:], -1))[0]
  return ends.tolist()


def solutions_from_samples(task, problems, splits, indices, prompt_ids,
                           samples: dict) -> list:
  """Solutions from sampler output rows (`PolicySampler.sample`).

  Args:
    task: the task adapter (decode_responses, score).
    problems: N problems, one per row.
    splits: N split names.
    indices: N problem indices.
    prompt_ids: N lists of real prompt tokens.
    samples: the sampler output for the N rows.

  Returns:
    N `Solution`s, scored by the task's verifier.
  """
  texts = task.decode_responses(samples["tokens"], samples["response_mask"])
  finished = ~np.asarray(samples["truncated"], bool)
  rewards = task.score(list(problems), texts, finished).rewards
  responses = response_rows(samples["tokens"], samples["response_mask"])
  out = []
  for i, problem in enumerate(problems):
    out.append(Solution(
        problem=problem, split=splits[i], index=int(indices[i]),
        prompt_ids=list(prompt_ids[i]), response_ids=responses[i],
        step_ends=step_ends_from_ids(samples["step_ids"][i],
                                     samples["response_mask"][i]),
        finished=bool(finished[i]), outcome=float(rewards[i]),
        text=texts[i]))
  return out


@dataclasses.dataclass
class _Prefix:
  solution: Solution      # Any solution with this prefix (for the problem).
  response: tuple         # Response tokens of the prefix.
  remaining: int          # Expected tokens still to generate (batching key).


def estimate_prefix_values(prover: PolicySampler, task, prefixes, *,
                           num_rollouts: int, rng, batch_size: int,
                           prompt_width: int, response_budget: int):
  """Rolls every prefix out `num_rollouts` times; returns correct counts.

  Args:
    prover: the prover's sampler (its `max_new_tokens` is the budget G).
    task: the task adapter.
    prefixes: a list of `_Prefix`.
    num_rollouts: m.
    rng: PRNG key (batch i uses fold_in(rng, i)).
    batch_size: prefixes per sampler call (the last call is padded).
    prompt_width: P, prompt slots of the policy's layout.
    response_budget: G; a continuation is correct only if the whole
      response (prefix + continuation) ends with EOS within G tokens.

  Returns:
    (correct counts [len(prefixes)] int, generated tokens).
  """
  width = prompt_width + response_budget
  order = sorted(range(len(prefixes)), key=lambda i: prefixes[i].remaining)
  correct = np.zeros((len(prefixes),), np.int64)
  generated = 0
  for batch_index, start in enumerate(progress.track(
      range(0, len(order), batch_size), "labels: prefix rollouts",
      unit="batches")):
    chosen = order[start:start + batch_size]
    rows = [prefixes[i] for i in chosen]
    rows += [rows[0]] * (batch_size - len(rows))
    tokens, mask = left_pad(
        [list(p.solution.prompt_ids) + list(p.response) for p in rows],
        width, prover.pad_id)
    out = prover.sample(tokens, mask, jax.random.fold_in(rng, batch_index),
                        num_samples=num_rollouts)
    continuations = response_rows(out["tokens"], out["response_mask"])
    full, problems, finished = [], [], []
    for r, cont in enumerate(continuations[:len(chosen) * num_rollouts]):
      prefix = rows[r // num_rollouts]
      ids = list(prefix.response) + cont
      full.append(ids)
      problems.append(prefix.solution.problem)
      finished.append((not out["truncated"][r]) and
                      len(ids) <= response_budget)
      generated += len(cont)
    texts = _decode(task, full, prover.pad_id)
    rewards = task.score(problems, texts, np.asarray(finished)).rewards
    counts = np.asarray(rewards).reshape(len(chosen), num_rollouts).sum(1)
    correct[chosen] = np.rint(counts).astype(np.int64)
  return correct, generated


def _decode(task, sequences, pad_id):
  width = max([len(s) for s in sequences] + [1])
  tokens = np.full((len(sequences), width), pad_id, np.int32)
  mask = np.zeros((len(sequences), width), np.int32)
  for i, seq in enumerate(sequences):
    tokens[i, :len(seq)] = seq
    mask[i, :len(seq)] = 1
  return task.decode_responses(tokens, mask)


def _problem_key(solution):
  return (solution.split, solution.index)


class _PrefixTable:
  """Unique prefixes (problem, response tokens) -> row in a request list."""

  def __init__(self):
    self.prefixes, self._rows = [], {}

  def add(self, solution: Solution, num_steps: int) -> int:
    response = solution.prefix(num_steps)
    key = (_problem_key(solution), response)
    if key not in self._rows:
      self._rows[key] = len(self.prefixes)
      self.prefixes.append(_Prefix(
          solution, response,
          remaining=len(solution.response_ids) - len(response)))
    return self._rows[key]


def monte_carlo_labels(prover, task, solutions, *, num_rollouts: int, rng,
                       batch_size: int, prompt_width: int,
                       response_budget: int):
  """Math-Shepherd / PAV labels for every step of every solution.

  Returns:
    (one dict per solution with `q` [K] (Q̂_k), `hard` [K], `rollouts` [K]
    (continuations behind each label; 0 for the final step, whose label is
    the outcome), `v` (V̂ of the question) and `v_rollouts`; stats dict with
    `prefixes` (unique prefixes rolled out), `rollouts`, `generated_tokens`).
  """
  table = _PrefixTable()
  plan = []
  for solution in solutions:
    rows = [table.add(solution, k) for k in range(solution.num_steps)]
    plan.append(rows)  # rows[0]: empty prefix; rows[k]: through step k.
  correct, generated = estimate_prefix_values(
      prover, task, table.prefixes, num_rollouts=num_rollouts, rng=rng,
      batch_size=batch_size, prompt_width=prompt_width,
      response_budget=response_budget)
  records = []
  for solution, rows in zip(solutions, plan):
    soft, hard = math_shepherd_labels(correct[rows], np.full(len(rows),
                                                             num_rollouts))
    # soft[0] is the empty prefix; soft[k] the prefix through step k.
    q = soft[1:].tolist() + [solution.outcome]
    h = hard[1:].tolist() + [float(solution.outcome > 0)]
    counts = [num_rollouts] * (solution.num_steps - 1) + [0]
    records.append({"q": q, "hard": h, "rollouts": counts,
                    "v": float(soft[0]), "v_rollouts": num_rollouts})
  stats = {"prefixes": len(table.prefixes),
           "rollouts": len(table.prefixes) * num_rollouts,
           "generated_tokens": generated}
  return records, stats


class BinarySearch:
  """OmegaPRM's search for the first wrong step of one solution.

  Prefix x_{1:j} holds the first j steps. The invariant: x_{1:lo} is good
  (some continuation is correct) and x_{1:hi} is bad, so the first error is
  a step in (lo, hi] (1-based). Start lo = 0, hi = K; probe
  mid = ⌊(lo + hi) / 2⌋; stop when hi − lo = 1: the first error is step hi.
  """

  def __init__(self, num_steps: int):
    if num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
    self.lo, self.hi = 0, num_steps

  @property
  def done(self) -> bool:
    return self.hi - self.lo <= 1

  def probe(self) -> int:
    """The number of steps of the next prefix to roll out."""
    return (self.lo + self.hi) // 2

  def update(self, any_correct: bool):
    mid = self.probe()
    if any_correct:
      self.lo = mid
    else:
      self.hi = mid

  @property
  def first_error(self) -> int:
    """0-based index of the first wrong step (valid once `done`)."""
    return self.hi - 1


def binary_search_labels(prover, task, solutions, *, num_rollouts: int, rng,
                         batch_size: int, prompt_width: int,
                         response_budget: int):
  """Hard labels from OmegaPRM's binary search for the first error.

  Solutions with a correct outcome are all-positive (their own completion
  is a correct continuation of every prefix). For the others, the probes of
  all solutions run together, one batched round per level of the search.
  V̂ of each question is estimated from m rollouts of the empty prefix.

  Returns:
    (records as in `monte_carlo_labels`, with `q` NaN where no prefix was
    probed and `rollouts` 0 there; stats dict).
  """
  records = []
  for solution in solutions:
    count = solution.num_steps
    q = [float("nan")] * count
    q[-1] = solution.outcome
    records.append({"q": q, "hard": [1.0] * count, "rollouts": [0] * count,
                    "v": float("nan"), "v_rollouts": num_rollouts})
  searches = {i: BinarySearch(s.num_steps) for i, s in enumerate(solutions)
              if s.outcome <= 0}
  stats = {"prefixes": 0, "rollouts": 0, "generated_tokens": 0}
  round_index = 0
  while True:
    table = _PrefixTable()
    # The first round also rolls out the empty prefixes (V̂ of each question).
    roots = ([table.add(s, 0) for s in solutions] if round_index == 0
             else [])
    probes = [(i, search.probe(), table.add(solutions[i], search.probe()))
              for i, search in searches.items() if not search.done]
    if not table.prefixes:
      break
    correct, generated = estimate_prefix_values(
        prover, task, table.prefixes, num_rollouts=num_rollouts,
        rng=jax.random.fold_in(rng, round_index), batch_size=batch_size,
        prompt_width=prompt_width, response_budget=response_budget)
    stats["prefixes"] += len(table.prefixes)
    stats["rollouts"] += len(table.prefixes) * num_rollouts
    stats["generated_tokens"] += generated
    for s, row in enumerate(roots):
      records[s]["v"] = float(correct[row] / num_rollouts)
    for i, mid, row in probes:
      c = int(correct[row])
      records[i]["q"][mid - 1] = c / num_rollouts  # mid >= 1 while searching.
      records[i]["rollouts"][mid - 1] = num_rollouts
      searches[i].update(c > 0)
    round_index += 1
  for i, search in searches.items():
    first = search.first_error
    records[i]["hard"] = [1.0] * first + [0.0] * (solutions[i].num_steps -
                                                  first)
  return records, stats


LABEL_METHODS = {
    "mc": monte_carlo_labels,
    "binary_search": binary_search_labels,
}


# ------------------------------------------------------------- episodes ---
#
# A multi-turn episode (`rollout.episodes`) is labelled per turn: a turn is
# a step. The prefix through turn k is the prompt, the first k turns and
# the environment's observation after each of them; the prover continues
# it (`EpisodeProver.continue_prefixes`: the environment's state restored
# by replaying the prefix's turns, the policy going on from the prefix in
# its KV cache) and Q̂_k is the mean success of m continuations. As for
# single-turn solutions, the final turn's Q̂ is the episode's own outcome
# and the empty prefix's is V̂.


@dataclasses.dataclass
class EpisodeSolution:
  """A sampled episode to label (host data).

  Attributes:
    problem: the task problem.
    split: the problem's split.
    index: its index in the split's stream.
    prompt_ids: the real prompt tokens.
    response_ids: the episode's tokens after the prompt: the policy's turns
      and the observations between them.
    turn_ids: the turn of each token of `response_ids`, −1 on observations.
    finished: the episode ended on its own (done or EOS), not cut by the
      context.
    outcome: the episode's reward (1.0 / 0.0).
    text: the decoded episode (turns and observations).
    actions: the text of each turn.
  """
  problem: Any
  split: str
  index: int
  prompt_ids: list
  response_ids: list
  turn_ids: list
  finished: bool
  outcome: float
  text: str
  actions: list

  @property
  def num_steps(self) -> int:
    return len(self.actions)

  def turns(self, num_turns: int) -> tuple:
    """Token ids of the first `num_turns` turns (a tuple of tuples)."""
    ids = np.asarray(self.response_ids)
    turn_of = np.asarray(self.turn_ids)
    return tuple(tuple(ids[turn_of == j].tolist()) for j in range(num_turns))

  def prefix_length(self, num_turns: int) -> int:
    """Response tokens of the prefix through `num_turns` turns (their
    observations included): everything before turn `num_turns`."""
    if num_turns == 0:
      return 0
    if num_turns >= self.num_steps:
      return len(self.response_ids)
    return self.turn_ids.index(num_turns)


def episode_solutions(task, problems, splits, indices, out) -> list:
  """`EpisodeSolution`s of sampled episodes (an `episodes.EpisodeOutput`),
  scored by the task (`task.score` of the turns' texts)."""
  prompt_width = out.tokens.shape[1] - int(task.max_new_tokens)
  rewards = task.score(list(problems), out.actions, ~out.truncated).rewards
  result = []
  for r, problem in enumerate(problems):
    span = slice(prompt_width, prompt_width + int(out.lengths[r]))
    prompt = out.tokens[r, :prompt_width][
        out.attention_mask[r, :prompt_width].astype(bool)]
    response = out.tokens[r, span].tolist()
    result.append(EpisodeSolution(
        problem=problem, split=splits[r], index=int(indices[r]),
        prompt_ids=prompt.tolist(), response_ids=response,
        turn_ids=out.turn_ids[r, span].tolist(),
        finished=not bool(out.truncated[r]), outcome=float(rewards[r]),
        text=task.tokenizer.decode(np.asarray(response, np.int32),
                                   errors="replace"),
        actions=list(out.actions[r])))
  return result


class EpisodeProver:
  """Samples and continues episodes of a multi-turn task with fixed params.

  Calls are padded to a fixed number of rows (`rows`, when given), so every
  call compiles the same programs.
  """

  def __init__(self, task, model_config, params, *, temperature: float,
               top_p: float = 1.0):
    self.task = task
    self.model_config = model_config
    self.params = params
    self.temperature = temperature
    self.top_p = top_p

  def sample(self, problems, rng, *, num_samples: int):
    """`num_samples` episodes per problem, contiguous (`EpisodeOutput`)."""
    return self.task.sample_episodes(
        self.model_config, self.params, problems, rng,
        temperature=self.temperature, top_p=self.top_p,
        num_samples=num_samples)

  def continue_prefixes(self, problems, prefix_turns, rng, *, rows: int = 0):
    """One continuation of each prefix (all with the same number of turns).

    Returns:
      (rewards [N] float, N lists of response token ids (the whole
      episodes after the prompt), policy tokens generated).
    """
    problems, prefix_turns = list(problems), list(prefix_turns)
    count = len(problems)
    if rows > count:
      problems += problems[:1] * (rows - count)
      prefix_turns += prefix_turns[:1] * (rows - count)
    out = self.task.continue_episodes(
        self.model_config, self.params, problems, prefix_turns, rng,
        temperature=self.temperature, top_p=self.top_p)
    rewards = self.task.score(problems, out.actions, ~out.truncated).rewards
    width = out.tokens.shape[1] - int(self.task.max_new_tokens)
    responses = [out.tokens[r, width:width + int(out.lengths[r])].tolist()
                 for r in range(count)]
    prefix_tokens = sum(len(t) for turns in prefix_turns[:count]
                        for t in turns)
    generated = int(out.response_mask[:count].sum()) - prefix_tokens
    return np.asarray(rewards[:count], np.float64), responses, generated


def episode_monte_carlo_labels(prover: EpisodeProver, solutions, *,
                               num_rollouts: int, rng, batch_size: int):
  """Per-turn Monte-Carlo labels of episodes (`monte_carlo_labels` per turn).

    Q̂_k = c_k / m,  hard_k = 1[c_k > 0],  V̂ = Q̂ of the empty prefix,

  with c_k the successes of m prover episodes that continue the prefix
  through turn k and its observation; the final turn's Q̂ is the outcome.
  The prover replays the prefix's turns through a fresh environment to
  restore its state, which needs a deterministic environment: a
  continuation whose prefix tokens (the replayed observations) differ from
  the episode's raises. Identical prefixes (same problem, same turns) are
  rolled out once; prefixes of k turns are continued together, in calls of
  `batch_size` prefixes × m rows.

  Returns:
    (one dict per episode with `q` [K], `hard` [K], `rollouts` [K], `v`,
    `v_rollouts` and `turn_ids`; stats dict with `prefixes`, `rollouts`,
    `generated_tokens`).

  Raises:
    InputError: a replay that does not reproduce an episode's prefix.
  """
  table, keys, plan = [], {}, []
  for solution in solutions:
    rows = []
    for k in range(solution.num_steps):
      turns = solution.turns(k)
      key = (_problem_key(solution), turns)
      if key not in keys:
        keys[key] = len(table)
        table.append((solution, k, turns))
      rows.append(keys[key])
    plan.append(rows)  # rows[0]: empty prefix; rows[k]: through turn k.
  by_turns = {}
  for row, (_, k, _) in enumerate(table):
    by_turns.setdefault(k, []).append(row)
  correct = np.zeros((len(table),), np.int64)
  generated = 0
  calls = [(k, group[start:start + batch_size])
           for k, group in sorted(by_turns.items())
           for start in range(0, len(group), batch_size)]
  for call, (k, chosen) in enumerate(progress.track(
      calls, "labels: episode prefix rollouts", unit="batches")):
    problems, turns = [], []
    for row in chosen:
      solution, _, prefix = table[row]
      problems += [solution.problem] * num_rollouts
      turns += [prefix] * num_rollouts
    # Every call has the rows of a full one: one shape to compile.
    rewards, responses, tokens = prover.continue_prefixes(
        problems, turns, jax.random.fold_in(rng, call),
        rows=batch_size * num_rollouts)
    generated += tokens
    for i, row in enumerate(chosen):
      solution = table[row][0]
      length = solution.prefix_length(k)
      expected = solution.response_ids[:length]
      for response in responses[i * num_rollouts:(i + 1) * num_rollouts]:
        if response[:length] != expected:
          raise errors.InputError(
              f"episode {solution.split} #{solution.index}: replaying its "
              f"first {k} turns gave other observations than the episode's; "
              "turn labels need a deterministic environment.")
    counts = rewards.reshape(len(chosen), num_rollouts).sum(axis=1)
    correct[chosen] = np.rint(counts).astype(np.int64)
  records = []
  for solution, rows in zip(solutions, plan):
    soft, hard = math_shepherd_labels(correct[rows],
                                      np.full(len(rows), num_rollouts))
    records.append({
        "q": soft[1:].tolist() + [solution.outcome],
        "hard": hard[1:].tolist() + [float(solution.outcome > 0)],
        "rollouts": [num_rollouts] * (solution.num_steps - 1) + [0],
        "v": float(soft[0]), "v_rollouts": num_rollouts,
        "turn_ids": [int(t) for t in solution.turn_ids]})
  stats = {"prefixes": len(table), "rollouts": len(table) * num_rollouts,
           "generated_tokens": generated}
  return records, stats


def label_episodes(task, policy: EpisodeProver, prover: EpisodeProver,
                   problems, split: str, indices, *,
                   samples_per_problem: int, num_rollouts: int,
                   batch_size: int, sample_rng, rollout_rng):
  """Label records of episodes of `problems` (a labels-stage shard).

  The policy samples `samples_per_problem` episodes per problem, and the
  prefix through each turn (with its observation) gets `num_rollouts`
  prover episodes that continue it (`episode_monte_carlo_labels`). The
  records (`label_store`) carry `turn_ids`, so the prm stage trains on the
  turns as steps, observation tokens never scored, and the task's per-turn
  labels as `oracle`.

  Returns:
    (records, stats dict with `prefixes`, `rollouts`, `generated_tokens`,
    `sampled_tokens`).
  """
  problems, indices = list(problems), list(indices)
  n = samples_per_problem
  out = policy.sample(problems, sample_rng, num_samples=n)
  rows = [i for i in range(len(problems)) for _ in range(n)]
  solutions = episode_solutions(task, [problems[i] for i in rows],
                                [split] * len(rows),
                                [indices[i] for i in rows], out)
  records, stats = episode_monte_carlo_labels(
      prover, solutions, num_rollouts=num_rollouts, rng=rollout_rng,
      batch_size=batch_size)
  scored = task.score([s.problem for s in solutions],
                      [s.actions for s in solutions],
                      np.ones((len(solutions),), bool))
  result = []
  for solution, record, oracle, first_error in zip(
      solutions, records, scored.step_labels, scored.first_error):
    result.append(dict(
        split=solution.split, index=solution.index,
        question=task.prompts([solution.problem])[0],
        prompt_ids=[int(t) for t in solution.prompt_ids],
        response_ids=[int(t) for t in solution.response_ids],
        text=solution.text, finished=solution.finished,
        outcome=solution.outcome, oracle=[bool(x) for x in oracle],
        first_error=int(first_error), **record))
  stats["sampled_tokens"] = int(out.response_mask.sum())
  return result, stats
