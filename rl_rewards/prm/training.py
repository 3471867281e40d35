"""PRM, PAV and implicit-PRM training: label arrays, losses, update steps.

* PRM / PAV: binary cross-entropy on every labelled step, plus the value
  of the bare question at the prompt's last token:

    L = [Σ_{b,k} w_{b,k}·ℓ(p_{b,k}, y_{b,k}) + λ_v Σ_b ℓ(σ(v_b), V̂_b)]
        / [Σ_{b,k} w_{b,k} + λ_v·#{b : V̂_b known}],
    ℓ(p, y) = −y·log p − (1 − y)·log(1 − p),

  where p_{b,k} is the verifier's probability that step k is good: σ(z) of a
  score head at the step's last token (model "head", the recipe of TRL and
  Qwen), or the probability Π_t π_φ(y_t) the LM head gives the step's tokens
  (model "generative", initialised from the policy), and v the score head
  at the prompt's last token; with y the hard labels (a Math-Shepherd PRM), the soft Q̂^π (PAV: the
  verifier predicts Q^π and V^π, and Q^μ = 1 − (1 − Q^π)^K of a Best-of-K
  prover is derived from it), or the prover's Q̂^μ. Optional class
  balancing reweights the steps with y < ½ and y ≥ ½ to equal total weight
  within a batch (PAV trains with class-balanced sampling).
* Implicit PRM (Yuan et al.): a causal LM π_φ with r_φ(y) = β Σ_t log
  π_φ(y_t)/π_ref(y_t), trained on outcome labels only, with the CE loss or
  PRIME's group DPO loss (`core.implicit_prm_ce_loss`, `..._dpo_loss`).

Label sets become fixed-shape arrays in the policy's layout (prompt slots P,
response slots G, S step slots), steps found by the segmentation module's
token rule; steps beyond S are merged into the last slot, whose score is
read at the final token and whose target is therefore the final step's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_rewards import core
from rl_rewards import models
from rl_rewards.prm import labels as labels_lib
from rl_rewards.prm import scoring
from rl_rewards.tasks import segmentation
from rl_rewards.train import loss_parts
from rl_rewards.train import steps as steps_lib

TARGETS = ("hard", "soft", "progress", "prover")
# The token rule as one program per shape (eagerly, every operation
# compiles on its own).
_step_ids = jax.jit(segmentation.step_ids_from_tokens,
                    static_argnames=("eos_id",))


def label_arrays(records, *, prompt_width: int, response_budget: int,
                 num_steps: int, delimiter_mask, eos_id: int, pad_id: int,
                 target: str = "soft", prover_k: int = 1,
                 progress_ratio: float = 0.5,
                 drop_after_first_negative: bool = False) -> dict:
  """Label-set records -> fixed-shape training arrays (host numpy).

  Args:
    records: label records (`label_store`); an episode's `turn_ids` are
      its step ids (observation tokens out of the response).
    prompt_width: P.
    response_budget: G.
    num_steps: S.
    delimiter_mask: bool [V] step delimiters.
    eos_id: EOS id (the token rule's final-EOS exception).
    pad_id: padding id.
    target: which labels become `targets`: "hard" (1[some continuation
      correct]), "soft" (Q̂ of the rollout policy), "progress"
      (`labels.progress_labels`: 1 unless the step loses more than a
      fraction 1 − ρ of the prefix's Q̂) or "prover" (1 − (1 − Q̂)^K, a
      Best-of-K prover's value; the value target likewise).
    prover_k: K for target="prover".
    progress_ratio: ρ for target="progress".
    drop_after_first_negative: leave the steps after a solution's first
      negative step unlabelled (the Qwen PRM recipe: the labels after a
      mistake say little about those steps themselves). Negative: a 0
      target for "hard" and "progress", a 0 hard label otherwise.

  Returns:
    dict with [N, P+G] `tokens`, `attention_mask`, `response_mask`,
    `step_ids` (clamped to S); [N, S] `targets`, `target_mask` (labelled
    steps), `oracle`, `oracle_mask`; [N] `v_target`, `v_mask`, `outcome`,
    `first_error` (−1 none, −2 unknown).
  """
  if target not in TARGETS:
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}.")
  count = len(records)
  try:
    tokens, attention, response = scoring.layout_solutions(
        [r["prompt_ids"] for r in records],
        [r["response_ids"] for r in records], prompt_width=prompt_width,
        response_budget=response_budget, pad_id=pad_id)
  except ValueError as e:
    raise ValueError(f"label records: {e} The labels were made with another "
                     "task configuration.") from None
  raw_ids = np.array(_step_ids(
      tokens, response, np.asarray(delimiter_mask, bool),
      eos_id=segmentation.eos_id_tuple(eos_id)))
  for i, record in enumerate(records):
    if record.get("turn_ids") is not None:  # An episode: turns are steps.
      raw_ids[i] = -1
      raw_ids[i, prompt_width:prompt_width + len(record["turn_ids"])] = (
          record["turn_ids"])
      response[i] = raw_ids[i] >= 0  # Observations are never scored.
  token_steps = raw_ids.max(axis=1) + 1
  step_ids = np.where(raw_ids < 0, raw_ids,
                      np.minimum(raw_ids, num_steps - 1)).astype(np.int32)
  targets = np.zeros((count, num_steps), np.float32)
  target_mask = np.zeros((count, num_steps), bool)
  oracle = np.zeros((count, num_steps), np.float32)
  oracle_mask = np.zeros((count, num_steps), bool)
  v_target = np.zeros((count,), np.float32)
  v_mask = np.zeros((count,), bool)
  first_error = np.full((count,), -2, np.int32)
  for i, record in enumerate(records):
    k = len(record["hard"])
    if token_steps[i] != k:
      raise ValueError(
          f"label record {i} ({record['split']} #{record['index']}) has {k} "
          f"step labels but its tokens have {token_steps[i]} steps; the "
          "labels were made with another step delimiter.")
    q = np.array([np.nan if x is None else x for x in record["q"]],
                 np.float64)
    v = np.nan if record["v"] is None else float(record["v"])
    if target == "hard":
      values = np.asarray(record["hard"], np.float64)
    elif target == "progress":
      values = labels_lib.progress_labels(q, v, progress_ratio)
    else:
      values = q
    if target == "prover":
      values = 1 - (1 - values) ** prover_k
      v = 1 - (1 - v) ** prover_k
    last = k - 1
    if drop_after_first_negative:
      binary = values if target in ("hard", "progress") else np.asarray(
          record["hard"], np.float64)
      last = next((j for j, h in enumerate(binary) if h < 0.5), last)
    # Slot S − 1 is read at the final token: it takes the final label.
    slots = np.minimum(np.arange(k), num_steps - 1)
    for j in range(last + 1):
      if j >= num_steps - 1 and j != k - 1:
        continue
      targets[i, slots[j]] = 0.0 if np.isnan(values[j]) else values[j]
      target_mask[i, slots[j]] = not np.isnan(values[j])
    v_target[i] = 0.0 if np.isnan(v) else v
    v_mask[i] = not np.isnan(v)
    if record["oracle"] is not None:
      merged = scoring.merge_step_labels(record["oracle"], num_steps)
      oracle[i, :len(merged)] = merged
      oracle_mask[i, :len(merged)] = True
      first_error[i] = record["first_error"]
  return {"tokens": tokens, "attention_mask": attention,
          "response_mask": response, "step_ids": step_ids,
          "targets": targets, "target_mask": target_mask,
          "oracle": oracle, "oracle_mask": oracle_mask,
          "v_target": v_target, "v_mask": v_mask,
          "outcome": np.asarray([r["outcome"] for r in records], np.float32),
          "first_error": first_error}


def class_balance_scales(targets, mask):
  """(w_pos, w_neg): the weights of `class_balance_weights` for the classes
  y ≥ ½ and y < ½, from the class counts of this (whole) batch."""
  mask = mask.astype(jnp.float32)
  positive = (targets >= 0.5).astype(jnp.float32) * mask
  negative = mask - positive
  total = jnp.sum(mask)
  num_pos, num_neg = jnp.sum(positive), jnp.sum(negative)
  both = (num_pos > 0) & (num_neg > 0)
  w_pos = jnp.where(both, total / (2 * jnp.maximum(num_pos, 1)), 1.0)
  w_neg = jnp.where(both, total / (2 * jnp.maximum(num_neg, 1)), 1.0)
  return w_pos, w_neg


def _class_weights(targets, mask, w_pos, w_neg):
  mask = mask.astype(jnp.float32)
  positive = (targets >= 0.5).astype(jnp.float32) * mask
  negative = mask - positive
  return positive * w_pos + negative * w_neg


def class_balance_weights(targets, mask):
  """[B, S] weights giving steps with y < ½ and y ≥ ½ equal total weight.

  w = n / (2·n_class) for the step's class (n labelled steps); a class that
  is absent from the batch leaves the other with weight 1.
  """
  return _class_weights(targets, mask, *class_balance_scales(targets, mask))


def log_probs_from_logits(logits):
  """(log σ(z), log σ(−z)): the two class log-probabilities of logits z."""
  return jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)


def log_probs_from_log_p(log_p, max_log_p: float = -1e-6):
  """(log p, log(1 − p)) from log p ≤ 0 (clamped below 0 for a finite
  log(1 − p))."""
  log_p = jnp.minimum(log_p, max_log_p)
  return log_p, jnp.log(-jnp.expm1(log_p))


def prm_loss_normalizers(batch, *, value_weight: float,
                         balance_classes: bool = False):
  """Whole-batch quantities of `prm_loss`: class weights and denominators.

    D = max(Σ_{b,k} w_{b,k} + λ_v·Σ_b 1[V̂_b known], 1e-6)

  Args:
    batch: dict with `targets`, `target_mask` [B, S], `v_mask` [B] (the
      whole minibatch).
    value_weight: λ_v.
    balance_classes: class-balanced step weights (their class counts are
      the whole batch's).

  Returns:
    dict of float32 scalars: `denominator` D, `steps` (labelled steps),
    `values` (known V̂), and `w_pos`, `w_neg` with `balance_classes`.
  """
  targets, mask = batch["targets"], batch["target_mask"]
  norms = {}
  if balance_classes:
    norms["w_pos"], norms["w_neg"] = class_balance_scales(targets, mask)
    weights = _class_weights(targets, mask, norms["w_pos"], norms["w_neg"])
  else:
    weights = mask.astype(jnp.float32)
  v_weight = batch["v_mask"].astype(jnp.float32) * value_weight
  norms["denominator"] = jnp.maximum(jnp.sum(weights) + jnp.sum(v_weight),
                                     1e-6)
  norms["steps"] = core.masked_count(mask)
  norms["values"] = core.masked_count(batch["v_mask"])
  return norms


def prm_loss_part(step_log_p, step_log_not_p, v_logits, batch, norms, *,
                  value_weight: float):
  """A micro-batch's share of `prm_loss` (and of each metric) given the
  whole batch's `prm_loss_normalizers`: the sums of the module docstring's
  numerator over this micro-batch, divided by the whole batch's D."""
  targets = batch["targets"]
  mask = batch["target_mask"].astype(jnp.float32)
  weights = (_class_weights(targets, mask, norms["w_pos"], norms["w_neg"])
             if "w_pos" in norms else mask)
  step_losses = -(targets * step_log_p + (1 - targets) * step_log_not_p)
  v_weight = batch["v_mask"].astype(jnp.float32) * value_weight
  v_log_p, v_log_not_p = log_probs_from_logits(v_logits)
  v_losses = -(batch["v_target"] * v_log_p +
               (1 - batch["v_target"]) * v_log_not_p)
  loss = (jnp.sum(step_losses * weights) + jnp.sum(v_losses * v_weight)) / (
      norms["denominator"])
  agree = ((step_log_p >= jnp.log(0.5)) == (targets >= 0.5)).astype(
      jnp.float32)
  mean = loss_parts.masked_mean_part
  metrics = {
      "prm_loss": loss,
      "step_loss": mean(step_losses, mask, norms["steps"]),
      "step_accuracy": mean(agree, mask, norms["steps"]),
      "value_abs_error": mean(
          jnp.abs(jax.nn.sigmoid(v_logits) - batch["v_target"]),
          batch["v_mask"], norms["values"]),
  }
  return loss, metrics


def prm_loss(step_log_p, step_log_not_p, v_logits, batch, *,
             value_weight: float, balance_classes: bool = False):
  """The PRM/PAV cross-entropy of the module docstring.

    ℓ_k = −y_k·log p_k − (1 − y_k)·log(1 − p_k)  on labelled steps, plus
    λ_v·BCE(σ(v), V̂) for rows whose V̂ is known.

  Args:
    step_log_p: [B, S] log p_k (the verifier's probability that step k is
      good), e.g. log σ(z) of a score head.
    step_log_not_p: [B, S] log(1 − p_k).
    v_logits: [B] logits of V(question).
    batch: dict with `targets`, `target_mask` [B, S], `v_target`,
      `v_mask` [B].
    value_weight: λ_v (0: no value term).
    balance_classes: reweight steps by class (`class_balance_weights`).

  Returns:
    (scalar loss, metrics dict).
  """
  norms = prm_loss_normalizers(batch, value_weight=value_weight,
                               balance_classes=balance_classes)
  return prm_loss_part(step_log_p, step_log_not_p, v_logits, batch, norms,
                       value_weight=value_weight)


MODELS = ("head", "generative")


def model_step_log_probs(model_config, params, batch, *, model: str,
                         num_steps: int, with_value: bool = True,
                         chunk_size: int = steps_lib.CHUNK):
  """(log p [B, S], log(1 − p) [B, S], v logits [B]) of a head or
  generative PRM on a batch with `tokens`, `attention_mask`, `step_ids`.

  Without `with_value`, a generative PRM skips its score-head pass and
  returns zero v logits. `chunk_size`: positions per LM-head chunk of a
  generative PRM.
  """
  tokens, mask, step_ids = (batch["tokens"], batch["attention_mask"],
                            batch["step_ids"])
  if model == "head":
    logits = scoring.head_logits(model_config, params, tokens, mask)
    step_logits = core.tokens_to_steps(logits, step_ids, num_steps,
                                       reduce="last")
    prompt_end = scoring._prompt_end_index(mask, step_ids)  # pylint: disable=protected-access
    v_logits = jnp.take_along_axis(logits, prompt_end[:, None], 1)[:, 0]
    return (*log_probs_from_logits(step_logits), v_logits)
  if model == "generative":
    step_logp = scoring.generative_step_log_probs(
        model_config, params, tokens, mask, step_ids, num_steps,
        chunk_size=chunk_size)
    v_logits = (scoring.prompt_value_logits(model_config, params, tokens,
                                            mask, step_ids)
                if with_value else jnp.zeros(tokens.shape[:1]))
    return (*log_probs_from_log_p(step_logp), v_logits)
  raise ValueError(f"model must be one of {MODELS}, got {model!r}.")


def make_prm_step(model_config: models.ModelConfig,
                  tx: optax.GradientTransformation, *, num_steps: int,
                  model: str = "head", value_weight: float = 1.0,
                  balance_classes: bool = False, micro_batch_size: int = 0,
                  chunk_size: int = steps_lib.CHUNK,
                  fault=None):
  """One PRM/PAV update: `(state, batch) -> (state, metrics)` (un-jitted).

  With `micro_batch_size` > 0 the gradient is accumulated over micro-batches
  of that many rows; the class weights and the denominator are the whole
  batch's (`prm_loss_normalizers`), so the update equals the full-batch one.

  Batch: `tokens`, `attention_mask`, `step_ids` [B, T]; `targets`,
  `target_mask` [B, S]; `v_target`, `v_mask` [B] (see `label_arrays`).
  """
  if model not in MODELS:
    raise ValueError(f"model must be one of {MODELS}, got {model!r}.")

  def normalizers(batch):
    return prm_loss_normalizers(batch, value_weight=value_weight,
                                balance_classes=balance_classes)

  def loss_fn(params, batch, norms):
    log_p, log_not_p, v_logits = model_step_log_probs(
        model_config, params, batch, model=model, num_steps=num_steps,
        with_value=value_weight > 0, chunk_size=chunk_size)
    return prm_loss_part(log_p, log_not_p, v_logits, batch, norms,
                         value_weight=value_weight)

  return steps_lib.make_update_step(loss_fn, tx, normalizer_fn=normalizers,
                                    micro_batch_size=micro_batch_size,
                                    fault=fault)


IMPLICIT_LOSSES = ("ce", "dpo")


def make_implicit_step(model_config: models.ModelConfig,
                       tx: optax.GradientTransformation, *, beta: float,
                       loss: str, group_size: int, micro_batch_size: int = 0,
                       chunk_size: int = steps_lib.CHUNK,
                       fault=None):
  """One implicit-PRM update on outcome labels (CE or group DPO).

  CE is the mean over the rows with a non-zero `response_mask`
  (`core.implicit_prm_ce_loss`: an all-zero row is absent); DPO is the mean
  over all rows. The pairwise accuracy is the mean over groups with such a
  row. With `micro_batch_size` > 0 the micro-batches hold whole groups (the
  DPO loss compares the solutions of a problem, the accuracy ranks them)
  and every mean takes its denominator from the whole batch, so the update
  equals the full-batch one.

  Batch: `tokens`, `attention_mask`, `response_mask`, `ref_logprobs` [B, T],
  `labels` [B] (0/1 outcomes; rows of a group of `group_size` solutions of
  one problem are contiguous, which the DPO loss needs).
  """
  if loss not in IMPLICIT_LOSSES:
    raise ValueError(f"loss must be one of {IMPLICIT_LOSSES}, got {loss!r}.")

  def normalizers(batch):
    return {**steps_lib.row_normalizers(batch),
            **loss_parts.implicit_prm_normalizers(batch["response_mask"],
                                                  group_size)}

  def loss_fn(params, batch, norms):
    logp = models.token_logprobs(model_config, params, batch["tokens"],
                                 batch["attention_mask"],
                                 chunk_size=chunk_size)
    log_ratios = logp - batch["ref_logprobs"]
    mask, labels = batch["response_mask"], batch["labels"]
    present = loss_parts.present_rows(mask)
    if loss == "ce":
      value = loss_parts.masked_mean_part(
          core.implicit_prm_ce_row_losses(log_ratios, mask, labels,
                                          beta=beta),
          present, norms["rows"])
    else:
      value = loss_parts.row_fraction(logp.shape[0], norms) * (
          core.implicit_prm_dpo_loss(log_ratios, mask, labels, group_size,
                                     beta=beta))
    accuracy = loss_parts.masked_mean_part(
        core.implicit_prm_group_accuracies(log_ratios, mask, labels,
                                           group_size),
        jnp.any(present.reshape(-1, group_size), axis=1), norms["groups"])
    return value, {"prm_loss": value, "pairwise_accuracy": accuracy}

  return steps_lib.make_update_step(loss_fn, tx,
                                    normalizer_fn=normalizers,
                                    micro_batch_size=micro_batch_size,
                                    group_size=group_size, fault=fault)
