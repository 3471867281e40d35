"""SPA-RL: stepwise progress attribution (Wang et al., arXiv 2505.20732).

A progress estimator, a copy of the policy trunk with a scalar score head
(`heads=("score",)`, the extra model `progress`), predicts a contribution
ĉ_{b,k} for each turn k of episode b, read at the turn's last policy token
(`core.spa.turn_end_values`), and is regressed so that an episode's
contributions add up to its outcome R_b (`core.spa.progress_loss`):

    L = mean_b (Σ_k ĉ_{b,k} − R_b)².

Each RL step, on this rollout:

1. update the estimator once on L with its own optimizer
   (`rl.spa_rl.learning_rate`), over every episode with a turn (the
   accuracy filter weighs the policy's loss only);
2. score the rollout with the updated estimator (one forward pass): the
   paper trains the estimator first and then annotates the RL data with it,
   so the scores come after the update;
3. fuse, per turn, r_{b,k} = α·ĉ_{b,k} + β·g_{b,k} (α = `contribution_coef`,
   β = `grounding_coef`; the code's α = 1 and 0.5 per executed action),
   with the grounding signal g_{b,k} = 0 when the environment answered the
   turn's action with the hidden-operands task's unknown-action marker "?"
   (the analogue of ALFWorld's "Nothing happens"), else 1, and always 1 on
   an episode's last turn (as the code);
4. advantages (`core.spa.spa_turn_advantages`): the returns-to-go of the
   fused rewards at γ = 1, G_{b,k} = η·R_b + Σ_{j≥k} r_{b,j} (η =
   `outcome_coef`, 0 in the paper, where the outcome enters through
   Σ_k ĉ_k ≈ R), minus a group-relative baseline over the episodes' returns
   G_{b,0} (`rl.advantage_estimator`: "drgrpo" the group mean, "rloo" the
   mean of the other samples), on every policy token of turn k.

Where we differ from the paper: it trains the estimator offline on
trajectories collected from the SFT policy and then runs PPO with a value
model; here the estimator learns online on each rollout and the baseline
is the group-relative one of the RL loop (no critic). Its head reads the
trunk's last hidden state (the code's linear head reads the LM logits).
β·g adds β for every executed turn still to come, so with β > 0 the return
grows with the number of executed turns (as in the paper).

Logged (`train/spa_rl/*`): `loss` (L before the update), `loss_after` (L of
the scores used), `grad_norm`, `contribution_mean`, `sum_abs_error`
(mean |Σ_k ĉ − R|), `grounded_fraction`, and with the task's turn labels in
the batch (`rl.prm_source="oracle"`) `oracle_corr`, the Pearson correlation
of ĉ with the oracle's per-turn progress labels over the valid turns.
"""

import functools

import jax
import jax.numpy as jnp

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards import models
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import programs
from rl_rewards.runners.methods import base
from rl_rewards.sharding import mesh as mesh_lib
from rl_rewards.train import loss_parts
from rl_rewards.train import microbatch
from rl_rewards.train import steps

MODEL = "progress"
SCORES = "rl/spa_progress_scores"
UPDATE = "rl/spa_progress_update"
# The hidden-operands environment's answer to an action it cannot execute.
UNKNOWN_ACTION = "?"


def token_scores(model_config, params, tokens, attention_mask):
  """[B, T]: the score head's output at every position (after reading the
  token at that position; not shifted like a value model's V_t)."""
  scores, _ = models.apply(model_config, params, tokens,
                           attention_mask=attention_mask, head="score")
  return scores.astype(jnp.float32)


def scores_pass(config, model_config):
  """`(params, tokens, attention_mask) -> [B, T]` token scores, jitted, over
  micro-batches of `rl.pass_micro_batch_size` rows."""
  rows = config_lib.pass_micro_batch_size(config.rl)

  def fn(params, tokens, attention_mask):
    return microbatch.map_rows(
        lambda b: token_scores(model_config, params, b["tokens"],
                               b["attention_mask"]),
        {"tokens": tokens, "attention_mask": attention_mask}, rows)

  return jax.jit(fn)


def progress_step_fn(config, model_config, tx):
  """One estimator update on the sum-to-outcome loss.

    L = Σ_{b∈P} (Σ_k ĉ_{b,k} − R_b)² / |P|,  P = rows with a turn,

  |P| counted on the whole batch, so micro-batches of `rl.micro_batch_size`
  rows give the same update. Batch: `tokens`, `attention_mask`,
  `response_mask`, `step_ids` [B, T], `rewards` [B]. Metrics: `spa_loss`
  (before the update), `spa_grad_norm`, `spa_skipped`.
  """
  num_turns = config.task.max_steps

  def normalizers(batch):
    return {"rows": jnp.sum(loss_parts.present_rows(batch["step_ids"] >= 0))
                    .astype(jnp.float32)}

  def loss_fn(params, batch, norms):
    scores = token_scores(model_config, params, batch["tokens"],
                          batch["attention_mask"])
    ids = batch["step_ids"]
    contributions = core.spa.turn_end_values(scores, ids, num_turns)
    mask = core.step_mask_from_ids(ids, num_turns)
    losses = core.spa.progress_row_losses(contributions, mask,
                                          batch["rewards"])
    loss = loss_parts.safe_divide(jnp.sum(losses), norms["rows"])
    return loss, {"spa_loss": loss}

  return steps.make_update_step(
      loss_fn, tx, metric_prefix="spa_", normalizer_fn=normalizers,
      micro_batch_size=config.rl.micro_batch_size,
      fault=None)


def grounding(tokens, step_ids, unknown_id: int, num_turns: int):
  """[B, S] g_{b,k}: 0 when the first token after turn k is an observation
  token equal to `unknown_id` (the environment could not execute the
  action), else 1; the row's last turn is always 1."""
  following_id = jnp.pad(step_ids[:, 1:], ((0, 0), (0, 1)),
                         constant_values=-1)
  following_token = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  ends = core.step_end_mask_from_ids(step_ids)
  failed = ends & (following_id < 0) & (following_token == unknown_id)
  failed_turns = core.tokens_to_steps(failed.astype(jnp.float32), step_ids,
                                      num_turns) > 0
  last = core.num_steps_per_row(step_ids) - 1
  is_last = jnp.arange(num_turns)[None, :] == last[:, None]
  return jnp.where(failed_turns & ~is_last, 0.0, 1.0)


def _correlation(x, y, mask):
  """Pearson correlation of x and y over `mask` (0 when either is flat)."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  dx = (x - jnp.sum(x * m) / n) * m
  dy = (y - jnp.sum(y * m) / n) * m
  den = jnp.sqrt(jnp.sum(dx * dx) * jnp.sum(dy * dy))
  return jnp.where(den > 0, jnp.sum(dx * dy) / jnp.maximum(den, 1e-12), 0.0)


@functools.partial(jax.jit, static_argnames=("num_turns", "unknown_id"))
def _score_turns(scores, tokens, step_ids, rewards, labels, *,
                 num_turns: int, unknown_id: int):
  """(contributions [B, S], grounding [B, S], metrics) of one rollout."""
  contributions = core.spa.turn_end_values(scores, step_ids, num_turns)
  mask = core.step_mask_from_ids(step_ids, num_turns)
  g = (grounding(tokens, step_ids, unknown_id, num_turns) if unknown_id >= 0
       else jnp.ones_like(contributions))
  present = jnp.any(mask, axis=1)
  total = jnp.sum(jnp.where(mask, contributions, 0.0), axis=1)
  rows = jnp.maximum(jnp.sum(present), 1)
  metrics = {
      "loss_after": core.spa.progress_loss(contributions, mask, rewards),
      "contribution_mean": core.masked_mean(contributions, mask),
      "sum_abs_error": jnp.sum(jnp.where(present, jnp.abs(total - rewards),
                                         0.0)) / rows,
      "grounded_fraction": core.masked_mean(g, mask),
  }
  if labels is not None:
    metrics["oracle_corr"] = _correlation(contributions,
                                          labels.astype(jnp.float32), mask)
  return contributions, g, metrics


class SPARL(base.Method):
  """`rl.method="spa_rl"`: the progress estimator is the extra model
  `progress`."""

  def __init__(self, config, verifier=None):
    super().__init__(config, verifier)
    self.reads_step_scores = self.reads_step_scores_of(config)

  @classmethod
  def reads_step_scores_of(cls, config) -> bool:
    # The oracle's turn labels, for the `oracle_corr` diagnostic only: the
    # advantages never read them.
    return config.rl.prm_source == "oracle"

  def check(self):
    cfg = self.cfg
    base.require(cfg.advantage_estimator in core.spa.BASELINES,
                 "rl.advantage_estimator",
                 "SPA-RL's baseline is group-relative over the episodes' "
                 "returns without a std: use drgrpo (group mean) or rloo, "
                 f"got {cfg.advantage_estimator!r}.")
    base.require(cfg.spa_rl.grounding_coef == 0 or
                 self.config.task.name == "hidden_operands",
                 "rl.spa_rl.grounding_coef",
                 "the grounding signal is the hidden-operands environment's "
                 "answer to an action it cannot execute; set 0 on "
                 f"task {self.config.task.name!r}.")

  def programs(self, model_config):
    tx = programs.rl_optimizer(self.cfg, self.cfg.spa_rl.learning_rate)
    return (
        programs.Pass(SCORES, MODEL, ("score",),
                      scores_pass(self.config, model_config)),
        programs.Update(
            UPDATE, MODEL, ("score",), tx,
            progress_step_fn(self.config, model_config, tx),
            {"step_ids": jnp.int32, "rewards": jnp.float32},
            rows="rollout", widths={"rewards": 0}))

  def init_models(self, ctx, params):
    return {MODEL: models.init_from_backbone(
        ctx.model_config, jax.device_get(params), ctx.rng("progress_init"),
        heads=("score",))}

  def _unknown_id(self, ctx) -> int:
    if self.cfg.spa_rl.grounding_coef == 0:
      return -1
    return int(ctx.task.tokenizer.encode(UNKNOWN_ACTION)[0])

  def signals(self, ctx, fns, state, batch):
    # 1. Update the estimator on this rollout's outcomes.
    update_batch = {k: batch[k] for k in ("tokens", "attention_mask",
                                          "response_mask", "step_ids",
                                          "rewards")}
    state = dict(state)
    state[MODEL], metrics = fns[UPDATE](
        state[MODEL],
        jax.device_put(update_batch, mesh_lib.batch_sharding(ctx.mesh)))
    # 2. Score the rollout with the updated estimator.
    scores = fns[SCORES](state[MODEL].params, batch["tokens"],
                         batch["attention_mask"])
    contributions, g, scored = _score_turns(
        scores, batch["tokens"], batch["step_ids"], batch["rewards"],
        batch.get("step_scores"), num_turns=self.config.task.max_steps,
        unknown_id=self._unknown_id(ctx))
    record = {"train/spa_rl/loss": metrics["spa_loss"],
              "train/spa_rl/grad_norm": metrics["spa_grad_norm"],
              **{f"train/spa_rl/{k}": v for k, v in scored.items()}}
    return (state, {"spa_contributions": contributions, "spa_grounding": g},
            context_lib.host_scalars(record))

  def advantages(self, batch):
    cfg, own = self.cfg, self.cfg.spa_rl
    ids = batch["step_ids"]
    contributions = batch["spa_contributions"]
    mask = core.step_mask_from_ids(ids, contributions.shape[1])
    turn_adv, _ = core.spa.spa_turn_advantages(
        contributions, mask, batch["rewards"], cfg.group_size,
        batch["spa_grounding"], alpha=own.contribution_coef,
        beta=own.grounding_coef, outcome_coef=own.outcome_coef,
        baseline=cfg.advantage_estimator)
    response = batch["response_mask"].astype(jnp.float32)
    a = core.steps_to_tokens(turn_adv, ids) * response
    outcome = base.outcome_token_advantages(cfg, batch)
    return a, {"outcome": outcome, "process": a - outcome}
