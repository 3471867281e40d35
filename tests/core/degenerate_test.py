"""Every estimator on degenerate and padded batches: finite, padding-invariant.

One batch holds all the awkward cases at once: an all-padding row, a
response without any delimiter, consecutive delimiters (steps made of the
delimiter only), a truncated response that fills the whole width, a group
whose scores are all equal, and groups of one.
"""

import jax
import numpy as np

import rl_rewards.core as rc

_N = 2


def _degenerate_batch():
  mask = np.array([
      [0, 0, 0, 0, 0, 0, 0, 0],  # All padding.
      [0, 1, 1, 1, 1, 0, 0, 0],  # No delimiter: one step.
      [1, 1, 1, 1, 1, 1, 0, 0],  # Consecutive delimiters.
      [1, 1, 1, 1, 1, 1, 1, 1],  # Truncated: fills the width.
  ], np.int32)
  ends = np.array([
      [1, 0, 0, 1, 0, 0, 0, 0],
      [0, 0, 0, 0, 0, 0, 0, 1],
      [0, 1, 1, 1, 0, 0, 0, 0],
      [0, 0, 1, 0, 0, 1, 0, 0],
  ], np.int32)
  rng = np.random.default_rng(0)
  return dict(
      mask=mask, ends=ends,
      rewards=rng.standard_normal(mask.shape).astype(np.float32),
      values=rng.standard_normal(mask.shape).astype(np.float32),
      logprobs=-rng.random(mask.shape).astype(np.float32),
      scores=np.array([1.0, 1.0, 0.0, 1.0], np.float32),  # Group 0 equal.
      step_rewards=rng.uniform(-1, 1, (4, 8)).astype(np.float32))


def _all_estimators(batch, group_size, num_steps):
  mask, rewards, values = batch["mask"], batch["rewards"], batch["values"]
  ids = rc.step_ids_from_step_ends(batch["ends"], mask)
  step_mask = rc.step_mask_from_ids(ids, num_steps)
  step_rewards = batch["step_rewards"][:, :num_steps]
  scores = batch["scores"]
  out = {"ids": ids}
  out["gae"], out["gae_returns"] = rc.gae(rewards, values, mask, gamma=0.9,
                                          lam=0.8)
  out["gae_whitened"] = rc.masked_whiten(out["gae"], mask)
  for estimator in ("grpo", "drgrpo", "rloo"):
    out[estimator] = rc.broadcast_to_tokens(
        rc.group_advantages(scores, group_size, estimator=estimator), mask)
  out["rpp"] = rc.reinforce_plus_plus(rewards, mask, gamma=0.9)[0]
  out["rpp_baseline"] = rc.reinforce_plus_plus_baseline(scores, mask,
                                                        group_size)[0]
  out["grpo_process"] = rc.grpo_process_advantages(step_rewards, step_mask,
                                                   ids, group_size)
  out["min_form"] = rc.steps_to_tokens(
      rc.min_form_returns(step_rewards, step_mask, form="paper"), ids)
  out["pure"] = rc.pure_advantages(step_rewards, ids, mask, group_size,
                                   solved=scores)[0]
  out["prime"] = rc.prime_advantages(rewards, scores, mask, group_size,
                                     batch_norm=True)[0]
  prover = rc.progress(rc.best_of_k(step_rewards ** 2, 4),
                       np.full(4, 0.3, np.float32), step_mask)
  out["pav"] = rc.pav_advantages(
      rc.group_advantages(scores, group_size, estimator="rloo"), prover, ids,
      mask, alpha=2.0)
  out["delta"] = rc.steps_to_tokens(
      rc.delta_step_rewards(rc.clip_step_rewards(step_rewards, step_mask,
                                                 eta=0.5), step_mask), ids)
  out["tp_grpo"] = rc.tp_grpo_advantages(step_rewards, ids, mask, scores,
                                         group_size, alpha=2.0,
                                         verdict_threshold=0.0)
  kl = rc.kl_divergence(batch["logprobs"], rewards, estimator="k3")
  out["policy_loss"] = rc.policy_loss(batch["logprobs"], 0.9 * rewards,
                                      out["grpo"], mask, dual_clip=3.0)[0]
  out["value_loss"] = rc.value_loss(values, 0.5 * values, out["gae_returns"],
                                    mask)[0]
  out["kl_loss"] = rc.aggregate_loss(kl, mask, mode="seq-mean-token-mean")
  out["ce"] = rc.implicit_prm_ce_loss(rewards, mask, scores, beta=0.05)
  out["dpo"] = rc.implicit_prm_dpo_loss(rewards, mask, scores, group_size,
                                        beta=0.05)
  return out


_JIT_ALL = jax.jit(_all_estimators, static_argnums=(1, 2))
_TOKEN_KEYS = ("gae", "gae_returns", "gae_whitened", "grpo", "drgrpo", "rloo",
               "rpp", "rpp_baseline", "grpo_process", "min_form", "pure",
               "prime", "pav", "delta", "tp_grpo")


def test_degenerate_batch_is_finite_and_masked():
  # Groups of one are covered next to each estimator's own tests.
  batch = _degenerate_batch()
  out = _JIT_ALL(batch, _N, 8)
  np.testing.assert_array_equal(
      out["ids"], [[-1] * 8, [-1, 0, 0, 0, 0, -1, -1, -1],
                   [0, 0, 1, 2, 3, 3, -1, -1], [0, 0, 0, 1, 1, 1, 2, 2]])
  for key, value in out.items():
    value = np.asarray(value)
    assert np.all(np.isfinite(value)), key
    if key in _TOKEN_KEYS:
      np.testing.assert_array_equal(value[batch["mask"] == 0], 0.0,
                                    err_msg=key)
  # The first group's scores are equal: no outcome signal at all.
  for key in ("grpo", "drgrpo", "rloo"):
    np.testing.assert_array_equal(np.asarray(out[key])[:2], 0.0)


def test_padding_changes_nothing_on_valid_positions():
  batch = _degenerate_batch()
  padded = dict(batch)
  extra = 5
  for key in ("mask", "ends", "rewards", "values", "logprobs"):
    fill = {"rewards": 3.0, "values": -7.0, "logprobs": -0.5,
            "ends": 1}.get(key, 0)
    padded[key] = np.pad(batch[key], ((0, 0), (0, extra)),
                         constant_values=fill)
  padded["step_rewards"] = np.pad(batch["step_rewards"], ((0, 0), (0, 4)),
                                  constant_values=-1.0)
  small = _JIT_ALL(batch, _N, 8)
  large = _JIT_ALL(padded, _N, 12)
  for key in _TOKEN_KEYS:
    np.testing.assert_allclose(np.asarray(large[key])[:, :8], small[key],
                               rtol=1e-5, atol=1e-6, err_msg=key)
  for key in ("policy_loss", "value_loss", "kl_loss", "ce", "dpo"):
    np.testing.assert_allclose(large[key], small[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
