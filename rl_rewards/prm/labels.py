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
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

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
