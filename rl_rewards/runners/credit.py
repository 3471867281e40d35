"""Credit assignment per RL method: a scored rollout batch -> token advantages.

Every method is a pure, jittable function of device arrays; the RL stage picks
one by `config.rl.method` from the explicit table `ADVANTAGE_FNS`. The inputs
are the rollout batch (DESIGN §4 layout) plus, for process-reward methods,
step scores `[B, S]` from a PRM (learned or the task's oracle):

  outcome      group baseline on the outcome (GRPO / Dr. GRPO / RLOO)
  pav          outcome advantage + α·A^μ_k on every token of step k (PAV)
  pure         min-form (softmin) PRM rewards, token RLOO baseline, + VR (PURE)
  grpo_process DeepSeekMath process supervision (sum-form, for comparison)
  clip_delta   outcome advantage + α·(future sum of Clip/Delta rewards)
  prime        implicit PRM token rewards + outcome, per-source RLOO (PRIME)
  ppo          GAE with a learned value model, whitened

Steps beyond `num_steps - 1` are merged into the last step slot (static S).
"""

import jax
import jax.numpy as jnp

from rl_rewards import core

METHODS = ("outcome", "pav", "pure", "grpo_process", "clip_delta", "prime",
           "ppo")
# Methods that read PRM step scores of the rollout.
PRM_METHODS = ("pav", "pure", "grpo_process", "clip_delta")


def clamp_step_ids(step_ids, num_steps: int):
  """Merges steps >= num_steps into the last slot; keeps -1 (off-response)."""
  return jnp.where(step_ids < 0, step_ids, jnp.minimum(step_ids, num_steps - 1))


def outcome_advantages(cfg, batch):
  """[B, T]: the group advantage of the outcome score on every token."""
  seq = core.group_advantages(batch["rewards"], cfg.group_size,
                              estimator=cfg.advantage_estimator,
                              eps=cfg.advantage_eps)
  return core.broadcast_to_tokens(seq, batch["response_mask"])


def pav_advantages(cfg, batch):
  """PAV effective reward: A^out + α·(Q^μ_k − Q^μ_{k−1}) on step k's tokens.

  `batch["q_steps"]` [B, S] is Q^π of each step prefix and `batch["v_init"]`
  [B] the value of the bare question, both under the base policy; the prover
  is Best-of-K of it, Q^μ = 1 − (1 − Q^π)^K (spec/algorithms.md §1.1).
  """
  seq = core.group_advantages(batch["rewards"], cfg.group_size,
                              estimator=cfg.advantage_estimator,
                              eps=cfg.advantage_eps)
  step_mask = core.step_mask_from_ids(batch["step_ids"],
                                      batch["q_steps"].shape[1])
  q_mu = core.best_of_k(batch["q_steps"], cfg.prover_k)
  v_mu = core.best_of_k(batch["v_init"], cfg.prover_k)
  prover_adv = core.progress(q_mu, v_mu, step_mask)
  return core.pav_advantages(seq, prover_adv, batch["step_ids"],
                             batch["response_mask"], alpha=cfg.pav_alpha)


def pure_advantages(cfg, batch):
  """PURE: softmin-transformed PRM rewards, token RLOO baseline, + VR."""
  solved = batch["rewards"] if cfg.verifiable_reward_coef > 0 else None
  # PURE's step reward p(+) − p(−) = 2p − 1 ∈ [−1, 1].
  advantages, _ = core.pure_advantages(
      2.0 * batch["step_scores"] - 1.0, batch["step_ids"],
      batch["response_mask"],
      cfg.group_size, temperature=cfg.pure_temperature, solved=solved,
      verifiable_coef=cfg.verifiable_reward_coef,
      baseline=cfg.pure_baseline, mask_step_ends=cfg.mask_step_end_tokens,
      normalize=True)
  return advantages


def grpo_process_advantages(cfg, batch):
  """DeepSeekMath process supervision plus the outcome group advantage."""
  step_mask = core.step_mask_from_ids(batch["step_ids"],
                                      batch["step_scores"].shape[1])
  process = core.grpo_process_advantages(
      batch["step_scores"], step_mask, batch["step_ids"], cfg.group_size,
      eps=cfg.advantage_eps)
  return outcome_advantages(cfg, batch) + cfg.process_coef * process


def clip_delta_advantages(cfg, batch):
  """A^out + α·Σ_{j ≥ k} r̃_j with Clip and/or Delta refined PRM rewards."""
  scores = batch["step_scores"]
  step_mask = core.step_mask_from_ids(batch["step_ids"], scores.shape[1])
  refined = scores
  if cfg.clip_delta_mode in ("clip", "clip_delta"):
    refined = core.clip_step_rewards(refined, step_mask, eta=cfg.clip_eta)
  if cfg.clip_delta_mode in ("delta", "clip_delta"):
    refined = core.delta_step_rewards(refined, step_mask)
  returns = core.step_returns(refined, step_mask)
  process = core.steps_to_tokens(returns, batch["step_ids"])
  process = jnp.where(batch["response_mask"] > 0, process, 0.0)
  return outcome_advantages(cfg, batch) + cfg.process_coef * process


def prime_advantages(cfg, batch):
  """PRIME: implicit token rewards and outcome, RLOO per source, whitened."""
  advantages, _ = core.prime_advantages(
      batch["implicit_rewards"], batch["rewards"], batch["response_mask"],
      cfg.group_size, process_coef=cfg.prime_process_coef,
      outcome_coef=cfg.prime_outcome_coef)
  return advantages


def ppo_advantages(cfg, batch):
  """GAE on the outcome reward with the value model's V_t, whitened."""
  mask = batch["response_mask"]
  rewards = core.outcome_token_rewards(batch["rewards"], mask)
  advantages, _ = core.gae(rewards, batch["values"], mask,
                           gamma=cfg.gae_gamma, lam=cfg.gae_lambda)
  return core.masked_whiten(advantages, mask)


def ppo_returns(cfg, batch):
  """The value targets of PPO: G_t = A_t + V_t (GAE before whitening)."""
  mask = batch["response_mask"]
  rewards = core.outcome_token_rewards(batch["rewards"], mask)
  _, returns = core.gae(rewards, batch["values"], mask,
                        gamma=cfg.gae_gamma, lam=cfg.gae_lambda)
  return returns


ADVANTAGE_FNS = {
    "outcome": outcome_advantages,
    "pav": pav_advantages,
    "pure": pure_advantages,
    "grpo_process": grpo_process_advantages,
    "clip_delta": clip_delta_advantages,
    "prime": prime_advantages,
    "ppo": ppo_advantages,
}


def make_advantage_fn(cfg):
  """The jitted `batch -> advantages [B, T]` of `cfg.method`."""
  fn = ADVANTAGE_FNS[cfg.method]
  return jax.jit(lambda batch: fn(cfg, batch))


# ------------------------------------------------------------------ oracle ---


def oracle_step_arrays(step_labels, num_steps: int):
  """Ground-truth step labels -> `[B, S]` arrays (host numpy).

  Returns:
    dict with `labels` (1.0 correct / 0.0 wrong), `q_steps` (Q of a perfect
    prover: 1 until the first wrong step, then 0), `v_init` (ones: a perfect
    prover solves the bare question) and `rewards` (+1 / −1, PURE's range).
    Steps beyond `num_steps` are merged into the last slot (correct only if
    all merged steps are).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  batch = len(step_labels)
  labels = np.zeros((batch, num_steps), np.float32)
  for b, row in enumerate(step_labels):
    row = [bool(x) for x in row]
    if len(row) > num_steps:
      row = row[:num_steps - 1] + [all(row[num_steps - 1:])]
    labels[b, :len(row)] = row
  q_steps = np.cumprod(labels, axis=1)
  return {"labels": labels, "q_steps": q_steps,
          "v_init": np.ones((batch,), np.float32),
          "rewards": 2.0 * labels - 1.0}
