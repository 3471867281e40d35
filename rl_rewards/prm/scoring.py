"""Step scores of whole solutions: learned PRMs, PAVs, the oracle, random.

A solution batch is the sampler's layout (DESIGN §4): `tokens` [B, T] with
the left-padded prompt first, `attention_mask` [B, T], and `step_ids`
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
* `implicit_step_scores`: an implicit PRM (Yuan et al., spec §1.4),
  q_t = β Σ_{u ≤ t} log π_φ(y_u)/π_ref(y_u); step score σ(q at the step's
  last token) and v_init = σ(0) = ½.
* `OracleScorer`: the task's step checker as a PRM (1.0 right, 0.0 wrong),
  or as a perfect prover's value (1 until the first wrong step, then 0).
* `RandomScorer`: i.i.d. uniform scores, the floor of every metric.

Scorer objects share `score_batch(batch) -> dict` on a `SolutionBatch`;
model scorers also expose `score_rollout(tokens, attention_mask, step_ids)`,
jitted once, which the RL stage calls on every rollout batch.
"""

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import core
from rl_rewards import models


def _prompt_end_index(attention_mask, step_ids):
  """[B] index of the last prompt token (attended, outside the response)."""
  is_prompt = (attention_mask > 0) & (step_ids < 0)
  positions = jnp.arange(step_ids.shape[1], dtype=jnp.int32)
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


def implicit_log_ratios(model_config, params, ref_params, tokens,
                        attention_mask):
  """[B, T] log π_φ(y_t) − log π_ref(y_t) (0 where a token has no context)."""
  logp = models.token_logprobs(model_config, params, tokens, attention_mask)
  ref = models.token_logprobs(model_config, ref_params, tokens,
                              attention_mask)
  return logp - ref


def implicit_step_scores(model_config, params, ref_params, tokens,
                         attention_mask, step_ids, num_steps: int, *,
                         beta: float):
  """Step scores of an implicit PRM: σ(q_t) at each step's last token.

  q_t = β Σ_{u ≤ t, u in the response} log π_φ(y_u)/π_ref(y_u), the soft
  Q-value of the prefix (spec §1.4, Prop. 3.1); before the response q = 0,
  so v_init = ½.

  Returns:
    (step_scores [B, S], step_mask [B, S], v_init [B]).
  """
  response = step_ids >= 0
  log_ratios = implicit_log_ratios(model_config, params, ref_params, tokens,
                                   attention_mask)
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


def _to_host(scores):
  step_scores, step_mask, v_init = jax.device_get(scores)
  return {"step_scores": np.asarray(step_scores, np.float32),
          "step_mask": np.asarray(step_mask, bool),
          "v_init": np.asarray(v_init, np.float32)}


class HeadScorer:
  """A score-head PRM or PAV; the forward pass is jitted once per shape."""

  def __init__(self, model_config, params, num_steps: int):
    self.model_config = model_config
    self.params = params
    self.num_steps = int(num_steps)
    self._score = jax.jit(
        lambda p, t, m, s: head_step_scores(model_config, p, t, m, s,
                                            self.num_steps))

  def score_rollout(self, tokens, attention_mask, step_ids) -> dict:
    """`{"step_scores" [B, S], "v_init" [B]}` as device arrays (RL stage)."""
    step_scores, _, v_init = self._score(self.params, tokens, attention_mask,
                                         step_ids)
    return {"step_scores": step_scores, "v_init": v_init}

  def score_batch(self, batch: SolutionBatch) -> dict:
    _check_slots(batch, self.num_steps)
    return _to_host(self._score(self.params, batch.tokens,
                                batch.attention_mask, batch.step_ids))


class ImplicitScorer:
  """An implicit PRM: β·log-ratio of a trained model to a reference."""

  def __init__(self, model_config, params, ref_params, num_steps: int, *,
               beta: float):
    self.model_config = model_config
    self.params = params
    self.ref_params = ref_params
    self.num_steps = int(num_steps)
    self._score = jax.jit(
        lambda p, r, t, m, s: implicit_step_scores(
            model_config, p, r, t, m, s, self.num_steps, beta=beta))

  def score_rollout(self, tokens, attention_mask, step_ids) -> dict:
    step_scores, _, v_init = self._score(self.params, self.ref_params, tokens,
                                         attention_mask, step_ids)
    return {"step_scores": step_scores, "v_init": v_init}

  def score_batch(self, batch: SolutionBatch) -> dict:
    _check_slots(batch, self.num_steps)
    return _to_host(self._score(self.params, self.ref_params, batch.tokens,
                                batch.attention_mask, batch.step_ids))


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
      merged = merge_step_labels(labels, batch.num_steps)
      if len(merged) != num_steps[b]:
        raise ValueError(
            f"solution {b}: the checker found {len(merged)} steps in "
            f"{batch.texts[b]!r} but the tokens have {num_steps[b]}; text "
            "and token segmentation disagree.")
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
