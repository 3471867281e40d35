"""Step-level beam search guided by a PRM or a PAV, with compute accounting.

Beam search (docs/algorithms.md; PAV §2): every problem keeps B beams,
partial solutions that end at a step boundary. Each round, every unfinished
beam samples C candidate next steps (the sampler stops a row at the step
delimiter or EOS, `stop_mask`); the B·C candidates are scored with the
verifier and the best B of them, together with the beams that already
finished, are kept. A candidate's score is

  prm:  aggregate(step scores of the candidate so far)   (last / min / ...)
  pav:  Q^π_k + α·(Q^μ_k − Q^μ_{k−1}),  Q^μ = 1 − (1 − Q^π)^K,

with Q^π_k the verifier's score of the candidate's newest step and Q^π_{k−1}
the previous step's (the question's V^π for the first step). Search stops
when every beam has finished (EOS, or a dead end: a step longer than the
step budget or a response over the length budget) or after `max_rounds`.
The answer is the finished beam with the highest final score (PAV reuses
Q^π of its last step as an outcome verifier).

Compute is counted in generated tokens: every token sampled for a candidate
counts, whether or not the candidate survives, which is what Best-of-N
spends on its N full samples.
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from rl_rewards import core
from rl_rewards.prm import labels as labels_lib
from rl_rewards.prm import scoring

SCORE_MODES = ("prm", "pav")


@dataclasses.dataclass
class _Beam:
  response: list          # Response tokens so far.
  score: float            # Ranking score.
  final_score: float      # Score used for the final pick.
  finished: bool = False  # Ended with EOS.
  dead: bool = False      # Cannot continue (over budget, step too long).


@dataclasses.dataclass
class SearchResult:
  """Outcome of a search over P problems.

  Attributes:
    texts: the chosen response of each problem.
    correct: [P] float 0/1 verdicts of the chosen responses.
    generated_tokens: [P] int tokens sampled per problem.
    rounds: rounds run.
  """
  texts: list
  correct: np.ndarray
  generated_tokens: np.ndarray
  rounds: int


def candidate_scores(step_scores, step_mask, v_init, *, mode: str,
                     aggregation: str = "last", alpha: float = 0.5,
                     prover_k: int = 4):
  """Ranking and final scores of candidates from their step scores.

  Args:
    step_scores: [N, S] verifier scores of each candidate's steps.
    step_mask: [N, S] step mask.
    v_init: [N] the question's score V^π.
    mode: "prm" (aggregate the step scores) or "pav" (effective reward of
      the newest step).
    aggregation: for "prm": min | last | product | mean.
    alpha: α of the PAV effective reward.
    prover_k: K of the Best-of-K prover.

  Returns:
    (ranking scores [N], final scores [N]) as numpy arrays; rows without
    steps score −inf.
  """
  if mode not in SCORE_MODES:
    raise ValueError(f"mode must be one of {SCORE_MODES}, got {mode!r}.")
  scores = np.asarray(step_scores, np.float32)
  mask = np.asarray(step_mask, bool)
  count = mask.sum(axis=1)
  rows = np.arange(scores.shape[0])
  last = scores[rows, np.maximum(count - 1, 0)]
  if mode == "prm":
    ranking = np.asarray(core.aggregate_step_scores(scores, mask,
                                                    aggregation))
    final = ranking
  else:
    previous = np.where(count >= 2, scores[rows, np.maximum(count - 2, 0)],
                        np.asarray(v_init, np.float32))
    advantage = (np.asarray(core.best_of_k(last, prover_k)) -
                 np.asarray(core.best_of_k(previous, prover_k)))
    ranking = last + alpha * advantage
    final = last
  ranking = np.where(count > 0, ranking, -np.inf)
  final = np.where(count > 0, final, -np.inf)
  return ranking.astype(np.float64), final.astype(np.float64)


def beam_search(policy: labels_lib.PolicySampler, scorer: Any, task,
                problems, *, beam_width: int, candidates: int, rng,
                prompt_width: int, response_budget: int, num_steps: int,
                step_tokens: int, max_rounds: int, mode: str = "prm",
                aggregation: str = "last", alpha: float = 0.5,
                prover_k: int = 4) -> SearchResult:
  """Step-level beam search on `problems` (see the module docstring).

  Args:
    policy: samples the candidate steps (temperature set there).
    scorer: any scorer with `score_batch(SolutionBatch)`.
    task: the task adapter.
    problems: P problems.
    beam_width: B.
    candidates: C next steps sampled per beam.
    rng: PRNG key (round r uses fold_in(rng, r)).
    prompt_width: P slots of the prompt.
    response_budget: G, the longest response.
    num_steps: S, step slots of the verifier.
    step_tokens: the longest step (new tokens per round).
    max_rounds: rounds before the search stops.
    mode: "prm" or "pav".
    aggregation: step-score aggregation for mode "prm".
    alpha: α for mode "pav".
    prover_k: K for mode "pav".

  Returns:
    A `SearchResult`.
  """
  if beam_width < 1 or candidates < 1:
    raise ValueError(f"need beam_width >= 1 and candidates >= 1, got "
                     f"{beam_width} and {candidates}.")
  num_problems = len(problems)
  tokens, mask = task.encode_prompts(problems)
  prompts = labels_lib.response_rows(tokens, mask)
  beams = [[_Beam([], 0.0, 0.0) for _ in range(beam_width)]
           for _ in range(num_problems)]
  generated = np.zeros((num_problems,), np.int64)
  stop_mask = np.asarray(task.delimiter_mask(), bool)
  rows = num_problems * beam_width
  width = prompt_width + response_budget
  rounds = 0
  while rounds < max_rounds and not all(
      b.finished or b.dead for row in beams for b in row):
    rounds += 1
    flat = [b for row in beams for b in row]
    prefix_tokens, prefix_mask = labels_lib.left_pad(
        [prompts[i // beam_width] + flat[i].response for i in range(rows)],
        width, policy.pad_id)
    out = policy.sample(prefix_tokens, prefix_mask,
                        jax.random.fold_in(rng, rounds),
                        num_samples=candidates, max_new_tokens=step_tokens,
                        stop_mask=stop_mask)
    steps = labels_lib.response_rows(out["tokens"], out["response_mask"])
    # Candidates of unfinished beams: (problem, beam, new response, status).
    pool = [[b for b in row if b.finished or b.dead] for row in beams]
    new = []
    for r, step in enumerate(steps):
      beam_row = r // candidates
      parent = flat[beam_row]
      if parent.finished or parent.dead:
        continue
      problem = beam_row // beam_width
      generated[problem] += len(step)
      response = parent.response + step
      ended = bool(step) and step[-1] in task.tokenizer.stop_ids
      dead = (len(response) > response_budget or
              (not ended and not out["stopped"][r]))
      new.append((problem, _Beam(response, -np.inf, -np.inf,
                                 finished=ended and not dead, dead=dead)))
    scorable = [(p, b) for p, b in new if not b.dead]
    if scorable:
      batch = scoring.make_solution_batch(
          task, [problems[p] for p, _ in scorable],
          [prompts[p] for p, _ in scorable], [b.response for _, b in scorable],
          prompt_width=prompt_width, response_budget=response_budget,
          num_steps=num_steps, rows=rows * candidates)
      result = scorer.score_batch(batch)
      ranking, final = candidate_scores(
          result["step_scores"], result["step_mask"], result["v_init"],
          mode=mode, aggregation=aggregation, alpha=alpha, prover_k=prover_k)
      for j, (_, beam) in enumerate(scorable):
        beam.score, beam.final_score = ranking[j], final[j]
    for problem, beam in new:
      pool[problem].append(beam)
    beams = [_keep_best(pool[p], beam_width) for p in range(num_problems)]
  texts, finished = [], []
  for row in beams:
    done = [b for b in row if b.finished]
    best = max(done or row, key=lambda b: b.final_score)
    texts.append(_decode_one(task, best.response))
    finished.append(best.finished)
  verdicts = task.score(list(problems), texts, np.asarray(finished, bool))
  return SearchResult(texts=texts, correct=np.asarray(verdicts.rewards),
                      generated_tokens=generated, rounds=rounds)


def _keep_best(pool, beam_width):
  """The best `beam_width` distinct beams, padded with inert placeholders
  (dead, scoring −inf) when fewer exist."""
  unique = {}
  for beam in sorted(pool, key=lambda b: -b.score):
    unique.setdefault(tuple(beam.response), beam)
  kept = [b for b in unique.values() if b.score > -np.inf][:beam_width]
  filler = _Beam([], -np.inf, -np.inf, dead=True)
  return kept + [filler] * (beam_width - len(kept))


def _decode_one(task, response):
  ids = np.asarray([response or [task.tokenizer.pad_id]], np.int32)
  mask = np.asarray([[1] * len(response) or [0]], np.int32)
  return task.decode_responses(ids, mask)[0]
