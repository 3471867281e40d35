"""The interface every credit-assignment method implements, and its defaults.

The RL loop (`runners/rl.py`) reads rollout → signals → advantages → updates
→ log, and asks the method at each point:

  per run                              per RL step
  -------                              -----------
  Method(config, verifier)             signals(ctx, fns, state, batch)
  check()                                -> (state, batch additions, record)
  programs(model_config)               advantages(batch) -> (A [B, T], parts)
    -> its passes and updates          update(fns, state, minibatch)
  init_models(ctx, params)               -> (state, metrics)
    -> {model: initial params}

Hooks return what later hooks read, and the loop passes it on: `programs`
declares each of the method's programs once (`programs.Pass`,
`programs.Update`: the run jits them, the memory planner compiles the same
declarations); `init_models` gives the initial parameters of the models the
updates train; the loop makes their states (with each update's optimizer)
and hands the callables back to `signals` and `update` as `fns`, a dict by
program name. A method holds only its config and its verifier.

`Method` itself is outcome-only credit assignment with no extra model; each
method module subclasses it and overrides what it needs. Its own keys are
the section `config.rl.<method>` (declared and checked in
`rl_rewards/config_methods.py`). Class flags tell the loop which shared
signals to put in the batch before `signals`:

  reads_step_scores  the step scores of the rollout, from the trained
                     verifier (`rl.prm_source="model"`) or the task's step
                     checker (`"oracle"`): `step_scores` [B, S] (P(step k
                     is correct)), `q_values` [B, S] (Q^π of each step
                     prefix; the oracle's perfect prover: 1 until the first
                     wrong step) and `v_init` [B] (V^π of the question);
  reads_reference    the reference policy's token log-probs `ref_logprobs`
                     [B, T] (also added whenever `rl.kl_coef` > 0);
  reads_answers      the ground-truth final answer of each row's problem,
                     as the policy writes it (`task.answer_tokens`):
                     `answer_tokens` [B, L] int32 and `answer_mask` [B, L].

Batch layout (`docs/data_model.md`): `tokens`, `attention_mask`,
`response_mask` (already multiplied by the accuracy filter's row weights),
`step_ids` (clamped to S = `task.max_steps` slots), `step_end_mask` (ends of
the unclamped steps: a merged last slot keeps its inner delimiters as ends),
`old_logprobs` [B, T] and `rewards` [B].
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

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


def require(condition: bool, key: str, message: str):
  """Raises `ConfigError("config.<key>: <message>")` unless `condition`."""
  if not condition:
    raise config_lib.ConfigError(f"config.{key}: {message}")


class Method:
  """Outcome-only credit assignment: the default of every hook.

  Args:
    config: the run's config (the method reads `config.rl` and its own
      section `config.rl.<method>`).
    verifier: the `Verifier` whose step scores the method reads (None for
      the oracle or a method that reads none; a planned one when the config
      is checked before the verifier is trained).
  """

  reads_step_scores = False
  reads_reference = False
  reads_answers = False  # Adds `answer_tokens`, `answer_mask` [B, L].
  update_keys: tuple = ()  # Extra batch keys `update` reads per minibatch.

  def __init__(self, config, verifier=None):
    self.config = config
    self.cfg = config.rl
    self.verifier = verifier

  @classmethod
  def reads_step_scores_of(cls, config) -> bool:
    """Whether the method reads step scores with `config` (before an
    instance exists: `methods.make` passes the verifier only then). A method
    whose keys decide it (PPO's `rl.ppo.reward`) overrides this and sets
    `reads_step_scores` on the instance to the same answer."""
    del config
    return cls.reads_step_scores

  # ------------------------------------------------------------ per run ---

  def check(self):
    """Raises `ConfigError` naming the key when the config (or the
    verifier) does not suit the method."""

  def programs(self, model_config) -> tuple:
    """The method's own programs: `programs.Pass` (a forward pass over each
    rollout) and `programs.Update` (the update of a model it trains beside
    the policy, with its optimizer) entries, for the run and the memory
    planner alike."""
    del model_config
    return ()

  def init_models(self, ctx, params) -> dict:
    """`{model: initial params}` of every model its updates train
    (checkpointed with the policy, each with its own optimizer state)."""
    del ctx, params
    return {}

  # ----------------------------------------------------------- per step ---

  def signals(self, ctx, fns: dict, state: dict, batch: dict):
    """The method's per-step signal: `(state, batch additions, record)`.

    `fns` holds the method's programs by name (`programs`), ready to call.
    May update extra models (PRIME's implicit PRM learns here, before the
    advantages, on this rollout's outcome labels).
    """
    del ctx, fns, batch
    return state, {}, {}

  def advantages(self, batch):
    """`(advantages [B, T], parts)`: pure and jittable (the loop jits it).

    `parts` splits the advantage for diagnostics where the method has the
    split: `outcome` and `process` [B, T] token arrays.
    """
    a = outcome_token_advantages(self.cfg, batch)
    return a, {"outcome": a}

  def update(self, fns: dict, state: dict, minibatch: dict):
    """Extra updates per policy minibatch: `(state, metrics)`."""
    del fns, minibatch
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
