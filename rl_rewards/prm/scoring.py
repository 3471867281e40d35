"""Step scores of whole solutions: learned PRMs, PAVs, the oracle, random.

A solution batch is the sampler's layout (docs/data_model.md): `tokens`
[B, T] with the left-padded prompt first, `attention_mask` [B, T], and `step_ids`
[B, T] (−1 off the response; ids ≥ S − 1 merged into the last of S slots).
Every scorer returns step scores in [0, 1]:

  step_scores [B, S]  score of the prefix through step k (0 on invalid slots)
  step_mask   [B, S]  k < K_b
  v_init      [B]     score of the bare question (the prompt's last token)

* `head_step_scores`: a decoder with a score head (a PRM or a PAV) in one
  forward pass; step k's score is σ(head output at step k's last token),
  v_init is σ(head output at the prompt's last token). A PRM trained on
  hard labels predicts P(step k correct); a PAV trained on soft Monte-Carlo
  labels predicts Q^π(prefix through step k) and V^π(question).
* `generative_step_scores`: the decoder's LM head as a verifier: step k's
  score is the probability the model gives to the step's tokens,
  Π_{t in step k} π_φ(y_t | y_<t) (at initialisation from the policy, the
  policy's own confidence in the step); v_init is σ(score head at the
  prompt's last token). A wrong step is one the verifier would not write.
* `implicit_step_scores`: an implicit PRM (Yuan et al., 2412.01981),
  q_t = β Σ_{u ≤ t} log π_φ(y_u)/π_ref(y_u); step score σ(q at the step's
  last token) and v_init = σ(0) = ½.
* `OracleScorer`: the task's step checker as a PRM (1.0 right, 0.0 wrong),
  or as a perfect prover's value (1 until the first wrong step, then 0).
* `RandomScorer`: i.i.d. uniform scores, the floor of every metric.

Scorer objects share `score_batch(batch) -> dict` on a `SolutionBatch`;
model scorers (`ModelScorer`) also expose `score_rollout(tokens,
attention_mask, step_ids)`, jitted once, which the RL stage calls on every
rollout batch.
"""

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import core
from rl_rewards import models
from rl_rewards.tasks import segmentation
from rl_rewards.train import microbatch

CHUNK = models.DEFAULT_LOGITS_CHUNK


def _prompt_end_index(attention_mask, step_ids):
  """[B] index of the last prompt token: attended, before the first
  response token (an episode's observations, later, are not the prompt)."""
  positions = jnp.arange(step_ids.shape[1], dtype=jnp.int32)
  first = jnp.min(jnp.where(step_ids >= 0, positions, step_ids.shape[1]),
                  axis=1, keepdims=True)
  is_prompt = (attention_mask > 0) & (step_ids < 0) & (positions < first)
  return jnp.maximum(jnp.max(jnp.where(is_prompt, positions, -1), axis=1), 0)


def step_scores_from_token_logits(token_logits, attention_mask, step_ids,
                                  num_steps: int):
  """Reads step and prompt scores off per-token logits.

    step_scores[b, k] = σ(z[b, e_k]),  v_init[b] = σ(z[b, p_b])

  with e_k the last token of step k and p_b the last prompt token.

  Args:
    token_logits: [B, T] float logits z.
    attention_mask: [B, T] 1 on prompt and response tokens.
    step_ids: [B, T] int step ids (−1 off the response), < num_steps.
    num_steps: static S.

  Returns:
    (step_scores [B, S], step_mask [B, S] bool, v_init [B]).
  """
  step_logits = core.tokens_to_steps(token_logits, step_ids, num_steps,
                                     reduce="last")
  step_mask = core.step_mask_from_ids(step_ids, num_steps)
  step_scores = jnp.where(step_mask, jax.nn.sigmoid(step_logits), 0.0)
  prompt_end = _prompt_end_index(attention_mask, step_ids)
  v_logit = jnp.take_along_axis(token_logits, prompt_end[:, None], axis=1)
  return step_scores, step_mask, jax.nn.sigmoid(v_logit[:, 0])


def head_logits(model_config, params, tokens, attention_mask):
  """[B, T] score-head logits of a PRM/PAV decoder."""
  logits, _ = models.apply(model_config, params, tokens,
                           attention_mask=attention_mask, head="score")
  return logits


def head_step_scores(model_config, params, tokens, attention_mask, step_ids,
                     num_steps: int):
  """Step scores of a score-head PRM/PAV in one forward pass.

  Args:
    model_config: the decoder's `ModelConfig`.
    params: parameters with a "score" head.
    tokens: [B, T] token ids.
    attention_mask: [B, T].
    step_ids: [B, T] step ids clamped to S slots.
    num_steps: static S.

  Returns:
    (step_scores [B, S], step_mask [B, S], v_init [B]).
  """
  return step_scores_from_token_logits(
      head_logits(model_config, params, tokens, attention_mask),
      attention_mask, step_ids, num_steps)


def generative_step_log_probs(model_config, params, tokens, attention_mask,
                              step_ids, num_steps: int, *,
                              chunk_size: int = CHUNK):
  """[B, S] log Π_{t in step k} π(y_t | y_<t) = Σ_t log π over the step
  (LM head in chunks of `chunk_size` positions)."""
  logp = models.token_logprobs(model_config, params, tokens, attention_mask,
                               chunk_size=chunk_size)
  return core.tokens_to_steps(jnp.where(step_ids >= 0, logp, 0.0), step_ids,
                              num_steps, reduce="sum")


def prompt_value_logits(model_config, params, tokens, attention_mask,
                        step_ids):
  """[B] score-head logits at the prompt's last token (V of the question)."""
  logits = head_logits(model_config, params, tokens, attention_mask)
  prompt_end = _prompt_end_index(attention_mask, step_ids)
  return jnp.take_along_axis(logits, prompt_end[:, None], axis=1)[:, 0]


def generative_step_scores(model_config, params, tokens, attention_mask,
                           step_ids, num_steps: int, *,
                           chunk_size: int = CHUNK):
  """Step scores of a generative PRM (parameters with "lm" and "score").

  Args:
    model_config: the decoder's `ModelConfig`.
    params: parameters with an "lm" and a "score" head.
    tokens: [B, T] token ids.
    attention_mask: [B, T].
    step_ids: [B, T] step ids clamped to S slots.
    num_steps: static S.
    chunk_size: positions per LM-head chunk.

  Returns:
    (step_scores [B, S] = exp(Σ_{t in step} log π), step_mask [B, S],
     v_init [B] = σ(score head at the prompt's last token)).
  """
  step_logp = generative_step_log_probs(model_config, params, tokens,
                                        attention_mask, step_ids, num_steps,
                                        chunk_size=chunk_size)
  step_mask = core.step_mask_from_ids(step_ids, num_steps)
  v_logit = prompt_value_logits(model_config, params, tokens, attention_mask,
                                step_ids)
  return (jnp.where(step_mask, jnp.exp(step_logp), 0.0), step_mask,
          jax.nn.sigmoid(v_logit))


def implicit_log_ratios(model_config, params, ref_params, tokens,
                        attention_mask, *, chunk_size: int = CHUNK):
  """[B, T] log π_φ(y_t) − log π_ref(y_t) (0 where a token has no context)."""
  logp = models.token_logprobs(model_config, params, tokens, attention_mask,
                               chunk_size=chunk_size)
  ref = models.token_logprobs(model_config, ref_params, tokens,
                              attention_mask, chunk_size=chunk_size)
  return logp - ref


def implicit_step_scores(model_config, params, ref_params, tokens,
                         attention_mask, step_ids, num_steps: int, *,
                         beta: float, chunk_size: int = CHUNK):
  """Step scores of an implicit PRM: σ(q_t) at each step's last token.

  q_t = β Σ_{u ≤ t, u in the response} log π_φ(y_u)/π_ref(y_u), the soft
  Q-value of the prefix (Yuan et al., Prop. 3.1); before the response q = 0,
  so v_init = ½.

  Returns:
    (step_scores [B, S], step_mask [B, S], v_init [B]).
  """
  response = step_ids >= 0
  log_ratios = implicit_log_ratios(model_config, params, ref_params, tokens,
                                   attention_mask, chunk_size=chunk_size)
  q = core.implicit_q_values(log_ratios, response, beta=beta)
  return step_scores_from_token_logits(
      jnp.where(response, q, 0.0), attention_mask, step_ids, num_steps)


@dataclasses.dataclass
class SolutionBatch:
  """Solutions to score: device-ready arrays plus host-side problem data.

  Attributes:
    tokens: [B, T] int32, left-padded prompt then response.
    attention_mask: [B, T] int32.
    step_ids: [B, T] int32 step ids clamped to `num_steps` slots.
    num_steps: S.
    problems: B task problems (for the oracle), or None.
    texts: B decoded responses (for the oracle), or None.
  """
  tokens: Any
  attention_mask: Any
  step_ids: Any
  num_steps: int
  problems: Optional[Sequence[Any]] = None
  texts: Optional[Sequence[str]] = None


def layout_solutions(prompt_ids, response_ids, *, prompt_width: int,
                     response_budget: int, pad_id: int):
  """Token lists -> the sampler's layout: P prompt slots, then G response.

  Args:
    prompt_ids: B lists of real prompt tokens (left-padded into P slots).
    response_ids: B lists of response tokens (right-padded into G slots).
    prompt_width: P.
    response_budget: G.
    pad_id: the padding id.

  Returns:
    ([B, P+G] tokens, attention_mask, response_mask), int32 numpy.

  Raises:
    ValueError: naming the first solution that does not fit.
  """
  count = len(prompt_ids)
  width = prompt_width + response_budget
  tokens = np.full((count, width), pad_id, np.int32)
  attention = np.zeros((count, width), np.int32)
  response = np.zeros((count, width), np.int32)
  for i, (prompt, resp) in enumerate(zip(prompt_ids, response_ids)):
    if len(prompt) > prompt_width or len(resp) > response_budget:
      raise ValueError(f"solution {i}: prompt {len(prompt)} / response "
                       f"{len(resp)} tokens exceed P={prompt_width} / "
                       f"G={response_budget}.")
    tokens[i, prompt_width - len(prompt):prompt_width] = prompt
    attention[i, prompt_width - len(prompt):prompt_width] = 1
    tokens[i, prompt_width:prompt_width + len(resp)] = resp
    attention[i, prompt_width:prompt_width + len(resp)] = 1
    response[i, prompt_width:prompt_width + len(resp)] = 1
  return tokens, attention, response


def make_solution_batch(task, problems, prompt_ids, response_ids, *,
                        prompt_width: int, response_budget: int,
                        num_steps: int, rows: int = 0) -> SolutionBatch:
  """A `SolutionBatch` in the policy's layout from token lists.

  Args:
    task: the task adapter (tokenizer ids, delimiter mask, decoding).
    problems: B problems.
    prompt_ids: B lists of real prompt tokens (left-padded into P slots).
    response_ids: B lists of response tokens (EOS included if finished).
    prompt_width: P.
    response_budget: G.
    num_steps: S; step ids ≥ S − 1 are merged into the last slot.
    rows: pad the batch to this many rows by repeating the first solution
      (so that every call has one shape); 0: no padding.

  Returns:
    The batch; `problems` and `texts` cover the padded rows too.
  """
  count = len(response_ids)
  if not count:
    raise ValueError("make_solution_batch needs at least one solution.")
  if rows and rows < count:
    raise ValueError(f"rows={rows} is smaller than the {count} solutions.")
  extra = max(rows - count, 0)
  problems = list(problems) + [problems[0]] * extra
  prompt_ids = list(prompt_ids) + [prompt_ids[0]] * extra
  response_ids = list(response_ids) + [response_ids[0]] * extra
  tokenizer = task.tokenizer
  tokens, attention, response = layout_solutions(
      prompt_ids, response_ids, prompt_width=prompt_width,
      response_budget=response_budget, pad_id=tokenizer.pad_id)
  step_ids = np.asarray(segmentation.step_ids_from_tokens(
      tokens, response, task.delimiter_mask(), eos_id=tokenizer.stop_ids))
  step_ids = np.where(step_ids < 0, step_ids,
                      np.minimum(step_ids, num_steps - 1)).astype(np.int32)
  texts = task.decode_responses(tokens[:, prompt_width:],
                                response[:, prompt_width:])
  return SolutionBatch(tokens=tokens, attention_mask=attention,
                       step_ids=step_ids, num_steps=num_steps,
                       problems=problems, texts=texts)


def _to_host(scores):
  step_scores, step_mask, v_init = jax.device_get(scores)
  return {"step_scores": np.asarray(step_scores, np.float32),
          "step_mask": np.asarray(step_mask, bool),
          "v_init": np.asarray(v_init, np.float32)}


class ModelScorer:
  """A learned verifier: a score function jitted once, with its parameters.

  `score_fn(*params, tokens, attention_mask, step_ids)` returns
  (step_scores, step_mask, v_init); see `head_scorer`, `generative_scorer`
  and `implicit_scorer`. With `micro_batch_size` > 0 the pass runs that many
  rows at a time inside the one jitted function (`microbatch.map_rows`, a
  `jax.lax.map`; a batch that is not a multiple is padded), results in row
  order, so memory follows the micro-batch.
  """

  def __init__(self, score_fn, params: Sequence[Any], num_steps: int, *,
               micro_batch_size: int = 0):
    self.params = tuple(params)
    self.num_steps = int(num_steps)
    self.micro_batch_size = int(micro_batch_size)

    def score(*args):
      *model_params, tokens, attention_mask, step_ids = args
      return microbatch.map_rows(
          lambda b: score_fn(*model_params, b["tokens"], b["attention_mask"],
                             b["step_ids"]),
          {"tokens": tokens, "attention_mask": attention_mask,
           "step_ids": step_ids}, self.micro_batch_size)

    self._score = jax.jit(score)

  def lower(self, tokens, attention_mask, step_ids):
    """The jitted score pass lowered for these (possibly abstract) inputs:
    what the memory planner compiles."""
    return self._score.lower(*self.params, tokens, attention_mask, step_ids)

  def score_rollout(self, tokens, attention_mask, step_ids,
                    params=None) -> dict:
    """`{"step_scores" [B, S], "v_init" [B]}` as device arrays (RL stage).

    `step_ids` must already be clamped to the scorer's S slots. `params`
    (shaped like `self.params`) replaces the verifier's own, e.g. a verifier
    refreshed during RL.
    """
    params = self.params if params is None else tuple(params)
    step_scores, _, v_init = self._score(*params, tokens, attention_mask,
                                         step_ids)
    return {"step_scores": step_scores, "v_init": v_init}

  def score_batch(self, batch: SolutionBatch) -> dict:
    """Host numpy `step_scores`, `step_mask` and `v_init` of a batch."""
    _check_slots(batch, self.num_steps)
    return _to_host(self._score(*self.params, batch.tokens,
                                batch.attention_mask, batch.step_ids))


def head_scorer(model_config, params, num_steps: int, *,
                micro_batch_size: int = 0) -> ModelScorer:
  """A score-head PRM or PAV (`head_step_scores`)."""
  return ModelScorer(
      lambda p, t, m, s: head_step_scores(model_config, p, t, m, s,
                                          num_steps), (params,), num_steps,
      micro_batch_size=micro_batch_size)


def generative_scorer(model_config, params, num_steps: int, *,
                      micro_batch_size: int = 0,
                      chunk_size: int = CHUNK) -> ModelScorer:
  """A generative PRM (`generative_step_scores`)."""
  return ModelScorer(
      lambda p, t, m, s: generative_step_scores(
          model_config, p, t, m, s, num_steps, chunk_size=chunk_size),
      (params,), num_steps, micro_batch_size=micro_batch_size)


def implicit_scorer(model_config, params, ref_params, num_steps: int, *,
                    beta: float, micro_batch_size: int = 0,
                    chunk_size: int = CHUNK) -> ModelScorer:
  """An implicit PRM against `ref_params` (`implicit_step_scores`)."""
  return ModelScorer(
      lambda p, r, t, m, s: implicit_step_scores(
          model_config, p, r, t, m, s, num_steps, beta=beta,
          chunk_size=chunk_size),
      (params, ref_params), num_steps, micro_batch_size=micro_batch_size)


def _check_slots(batch, num_steps):
  if batch.num_steps != num_steps:
    raise ValueError(f"the batch has {batch.num_steps} step slots, the "
                     f"scorer {num_steps}.")


def merge_step_labels(labels: Sequence[bool], num_steps: int) -> list[bool]:
  """Step labels merged into S slots: the last slot is right iff all of the
  steps merged into it are (the rule of the sampler's clamped step ids)."""
  labels = [bool(x) for x in labels]
  if len(labels) > num_steps:
    labels = labels[:num_steps - 1] + [all(labels[num_steps - 1:])]
  return labels


class OracleScorer:
  """The task's step checker as a PRM (needs problems and texts).

  With `as_value=False` a step scores 1.0 if the checker marks it right and
  0.0 otherwise (a perfect step-correctness PRM); with `as_value=True` the
  score is the value of a perfect prover, 1 until the first wrong step and
  0 from it on, and v_init = 1.
  """

  def __init__(self, task, as_value: bool = False):
    if not getattr(task, "has_step_labels", False):
      raise ValueError("the oracle PRM needs a task with ground-truth step "
                       "labels (the arithmetic task).")
    self.task = task
    self.as_value = as_value

  def score_batch(self, batch: SolutionBatch) -> dict:
    if batch.problems is None or batch.texts is None:
      raise ValueError("OracleScorer needs the batch's problems and texts.")
    count = len(batch.texts)
    scored = self.task.score(list(batch.problems), list(batch.texts),
                             np.ones((count,), bool))
    step_ids = np.asarray(batch.step_ids)
    num_steps = np.maximum(step_ids.max(axis=1) + 1, 0)
    scores = np.zeros((count, batch.num_steps), np.float32)
    for b, labels in enumerate(scored.step_labels):
      # Text and token steps agree except when the response holds special
      # tokens (PAD, BOS) that decoding drops; extra token steps are wrong.
      merged = merge_step_labels(labels, batch.num_steps)[:num_steps[b]]
      scores[b, :len(merged)] = merged
    if self.as_value:
      scores = np.cumprod(scores, axis=1)
    mask = np.arange(batch.num_steps)[None, :] < num_steps[:, None]
    return {"step_scores": np.where(mask, scores, 0.0).astype(np.float32),
            "step_mask": mask, "v_init": np.ones((count,), np.float32)}


class RandomScorer:
  """Uniform random step scores (seeded; a fresh draw per call)."""

  def __init__(self, seed: int = 0):
    self._rng = np.random.default_rng(seed)

  def score_batch(self, batch: SolutionBatch) -> dict:
    step_ids = np.asarray(batch.step_ids)
    count = step_ids.shape[0]
    num_steps = step_ids.max(axis=1) + 1
    mask = np.arange(batch.num_steps)[None, :] < num_steps[:, None]
    scores = self._rng.random((count, batch.num_steps)).astype(np.float32)
    return {"step_scores": np.where(mask, scores, 0.0).astype(np.float32),
            "step_mask": mask,
            "v_init": self._rng.random(count).astype(np.float32)}
