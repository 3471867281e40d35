"""The interface every credit-assignment method implements, and its defaults.

The RL loop (`runners/rl.py`) reads rollout → signals → advantages → updates
→ log, and asks the method at each point:

  per run                              per RL step
  -------                              -----------
  check(verifier)                      signals(ctx, state, batch)
  models(ctx, params)                    -> (state, batch, record)
  build(ctx, shardings)                advantages(batch) -> (A [B, T], parts)
  planned_programs(model_config)       update(state, minibatch)
    (what the planner compiles)          -> (state, metrics)

`Method` itself is outcome-only credit assignment with no extra model; each
method module subclasses it and overrides what it needs. Two class flags
tell the loop which shared signals to put in the batch before `signals`:

  reads_step_scores  the step scores of the rollout, from the trained
                     verifier (`rl.prm_source="model"`) or the task's step
                     checker (`"oracle"`): `step_scores` [B, S] (P(step k
                     is correct)), `q_values` [B, S] (Q^π of each step
                     prefix; the oracle's perfect prover: 1 until the first
                     wrong step) and `v_init` [B] (V^π of the question);
  reads_reference    the reference policy's token log-probs `ref_logprobs`
                     [B, T] (also added whenever `rl.kl_coef` > 0).

Batch layout (DESIGN §4): `tokens`, `attention_mask`, `response_mask`
(already multiplied by the accuracy filter's row weights), `step_ids`
(clamped to S = `task.max_steps` slots), `step_end_mask` (ends of the
unclamped steps: a merged last slot keeps its inner delimiters as ends),
`old_logprobs` [B, T] and `rewards` [B].
"""

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from rl_rewards import config_lib
from rl_rewards import core


@dataclasses.dataclass(frozen=True)
class Verifier:
  """A trained verifier as the RL stage sees it.

  Attributes:
    scorer: `score_rollout(tokens, attention_mask, step_ids) ->
      {"step_scores" [B, S], "v_init" [B]}` (None for a verifier that is
      only planned, when the config is checked before training it).
    model: "head", "generative" or "implicit" (`config.prm.model`).
    target: the labels it was trained on: "soft" (Q̂^π), "hard",
      "progress", "prover" (Q̂^μ), or "outcome" for an implicit PRM.
    prover_k: K of the Best-of-K prover whose value its scores are: 1
      unless target="prover" with Best-of-K labels.
    value_trained: whether its V(question) output was trained.
  """
  scorer: Any
  model: str
  target: str
  prover_k: int = 1
  value_trained: bool = True

  @classmethod
  def planned(cls, config):
    """The verifier `config.prm` will train (for checks before training)."""
    prm, labels = config.prm, config.labels
    return cls(scorer=None, model=prm.model,
               target="outcome" if prm.model == "implicit" else prm.target,
               prover_k=(labels.prover_k if prm.target == "prover" and
                         labels.prover == "best_of_k" else 1),
               value_trained=prm.value_weight > 0)


@dataclasses.dataclass(frozen=True)
class ExtraModel:
  """A model a method trains beside the policy: its initial parameters, its
  optimizer and the heads its parameters hold."""
  params: Any
  tx: Any
  heads: tuple = ("lm",)


def require(condition: bool, key: str, message: str):
  """Raises `ConfigError("config.<key>: <message>")` unless `condition`."""
  if not condition:
    raise config_lib.ConfigError(f"config.{key}: {message}")


class Method:
  """Outcome-only credit assignment: the default of every hook."""

  reads_step_scores = False
  reads_reference = False
  update_keys: tuple = ()  # Extra batch keys `update` reads per minibatch.

  def __init__(self, config):
    self.config = config
    self.cfg = config.rl

  # ------------------------------------------------------------ per run ---

  def check(self, verifier=None):
    """Raises `ConfigError` naming the key when the config (or `verifier`,
    a `Verifier` or None) does not suit the method."""
    del verifier

  def models(self, ctx, params) -> dict:
    """Extra trained models `{name: ExtraModel}` (checkpointed with the
    policy, each with its own optimizer state)."""
    del ctx, params
    return {}

  def build(self, ctx, shardings: dict):
    """Builds the method's jitted programs once the states exist."""
    del ctx, shardings

  def planned_programs(self, model_config) -> tuple:
    """The programs of the method's own models, for the memory planner
    (`programs.pipeline_programs`): `programs.PlannedPass` and
    `programs.PlannedUpdate` entries, with the functions `build` jits."""
    del model_config
    return ()

  # ----------------------------------------------------------- per step ---

  def signals(self, ctx, state: dict, batch: dict):
    """The method's per-step signal: `(state, batch additions, record)`.

    May update extra models (PRIME's implicit PRM learns here, before the
    advantages, on this rollout's outcome labels).
    """
    del ctx, batch
    return state, {}, {}

  def advantages(self, batch):
    """`(advantages [B, T], parts)`: pure and jittable (the loop jits it).

    `parts` splits the advantage for diagnostics where the method has the
    split: `outcome` and `process` [B, T] token arrays.
    """
    a = outcome_token_advantages(self.cfg, batch)
    return a, {"outcome": a}

  def update(self, state: dict, minibatch: dict):
    """Extra updates per policy minibatch: `(state, metrics)`."""
    del minibatch
    return state, {}


# ---------------------------------------------------------------- shared ---


def outcome_advantages(cfg, batch, estimator=None):
  """[B] group advantage of the outcome (`rl.advantage_estimator`)."""
  return core.group_advantages(
      batch["rewards"], cfg.group_size,
      estimator=estimator or cfg.advantage_estimator, eps=cfg.advantage_eps)


def outcome_token_advantages(cfg, batch, estimator=None):
  """[B, T]: the group advantage of the outcome on every response token."""
  return core.broadcast_to_tokens(outcome_advantages(cfg, batch, estimator),
                                  batch["response_mask"])


def clamp_step_ids(step_ids, num_steps: int):
  """Merges steps >= num_steps into the last slot; keeps −1 (off-response)."""
  return jnp.where(step_ids < 0, step_ids, jnp.minimum(step_ids, num_steps - 1))


def oracle_step_arrays(step_labels, num_steps: int):
  """Ground-truth step labels -> `[B, S]` host arrays.

  Returns:
    dict with `labels` (1.0 correct / 0.0 wrong), `q_values` (Q of a perfect
    prover: 1 until the first wrong step, then 0), `v_init` (ones: a perfect
    prover solves the bare question). Steps beyond `num_steps` are merged
    into the last slot (correct only if all merged steps are).
  """
  batch = len(step_labels)
  labels = np.zeros((batch, num_steps), np.float32)
  for b, row in enumerate(step_labels):
    row = [bool(x) for x in row]
    if len(row) > num_steps:
      row = row[:num_steps - 1] + [all(row[num_steps - 1:])]
    labels[b, :len(row)] = row
  return {"labels": labels, "q_values": np.cumprod(labels, axis=1),
          "v_init": np.ones((batch,), np.float32)}
