"""Each method's own rule, hand-computed: advantages from a given batch,
the checks of its keys and verifier (no RL loop; `methods_test.py` runs
the loop)."""

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards.runners import methods
from rl_rewards.runners import pipeline
from rl_rewards.runners import rl
from rl_rewards.runners import step_scores
from rl_rewards.runners.methods import base
from rl_rewards.runners.methods import ppo
from tests.core import core_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _random_batch(rng, batch=8, length=12, num_steps=4):
  response = np.zeros((batch, length), np.int32)
  step_ids = np.full((batch, length), -1, np.int32)
  for b in range(batch):
    n = rng.integers(1, length - 3)
    response[b, 3:3 + n] = 1
    ends = np.sort(rng.choice(np.arange(n), size=min(n, 3), replace=False))
    k = 0
    for t in range(n):
      step_ids[b, 3 + t] = min(k, num_steps - 1)
      if t in ends:
        k += 1
  scores = rng.random((batch, num_steps), np.float32)
  return {
      "response_mask": jnp.asarray(response),
      "step_ids": jnp.asarray(step_ids),
      "step_end_mask": core_ends(step_ids),
      "rewards": jnp.asarray(rng.integers(0, 2, batch).astype(np.float32)),
      "q_values": jnp.asarray(scores),
      "step_scores": jnp.asarray(scores),
      "v_init": jnp.asarray(rng.random(batch).astype(np.float32)),
  }


def core_ends(step_ids):
  return rl.core.step_end_mask_from_ids(jnp.asarray(step_ids))


def _method(name, verifier=None, **values):
  """The method `name` with `config.rl` values; a key `section.key` sets
  the method's own key `config.rl.section.key`."""
  config = config_lib.base_config()
  config.rl.method = name
  config.rl.group_size = 4
  for key, value in values.items():
    section, _, key = key.rpartition(".")
    (config.rl[section] if section else config.rl)[key] = value
  return methods.make(config, verifier)


def test_methods_table_names_each_methods_class():
  assert list(methods.METHODS) == list(config_methods.METHODS)
  for name, cls in methods.METHODS.items():
    assert issubclass(cls, base.Method)
    assert cls.__module__ == f"rl_rewards.runners.methods.{name}"


def test_pav_with_zero_alpha_is_the_outcome_baseline():
  batch = _random_batch(np.random.default_rng(0))
  outcome, _ = _method("outcome", advantage_estimator="drgrpo").advantages(
      batch)
  pav, parts = _method("pav", **{"pav.alpha": 0.0},
                       advantage_estimator="drgrpo").advantages(batch)
  np.testing.assert_array_equal(np.asarray(pav), np.asarray(outcome))
  np.testing.assert_array_equal(np.asarray(parts["process"]), 0.0)
  # And a nonzero alpha really adds a per-step term.
  pav1, _ = _method("pav", **{"pav.alpha": 1.0},
                    advantage_estimator="drgrpo").advantages(batch)
  assert not np.allclose(np.asarray(pav1), np.asarray(outcome))


def _pav_batch():
  # One group of 2: rewards [1, 0]. Row 0 has 2 steps with Q^π = [0.2, 0.5]
  # and V^π = 0.25; row 1 one step.
  return {
      "response_mask": jnp.array([[0, 1, 1, 1], [0, 1, 1, 0]]),
      "step_ids": jnp.array([[-1, 0, 1, 1], [-1, 0, 0, -1]]),
      "rewards": jnp.array([1.0, 0.0]),
      "q_values": jnp.array([[0.2, 0.5], [0.2, 0.0]]),
      "v_init": jnp.array([0.25, 0.2]),
  }


def test_pav_best_of_k_is_applied_once_hand_computed():
  # K = 4: Q^μ = 1 − (1 − Q)^4 = [0.5904, 0.9375], V^μ = 1 − 0.75^4 =
  # 0.68359, so A^μ = [−0.09320, 0.34710]. Dr. GRPO outcome: r − mean =
  # ±0.5, no std. α = 2.
  values = {"group_size": 2, "pav.alpha": 2.0, "pav.prover_k": 4,
            "advantage_estimator": "drgrpo"}
  method = _method("pav", base.Verifier(None, "head", "soft"), **values)
  method.check()
  adv, parts = method.advantages(_pav_batch())
  a_mu = np.array([0.5904 - 0.68359375, 0.9375 - 0.5904])
  np.testing.assert_allclose(a_mu, [-0.09320, 0.34710], atol=1e-5)
  np.testing.assert_allclose(np.asarray(adv)[0],
                             [0, 0.5 + 2 * a_mu[0], 0.5 + 2 * a_mu[1],
                              0.5 + 2 * a_mu[1]], atol=1e-5)
  np.testing.assert_allclose(np.asarray(parts["outcome"])[0],
                             [0, 0.5, 0.5, 0.5])
  # A verifier trained on the Best-of-4 prover's values predicts Q^μ: its
  # scores are used as they are, not put through Best-of-K again.
  prover = _method("pav", base.Verifier(None, "head", "prover", prover_k=4),
                   **values)
  prover.check()
  q_mu = dict(_pav_batch(), q_values=jnp.array([[0.5904, 0.9375],
                                                 [0.5904, 0.0]]),
              v_init=jnp.array([0.68359375, 0.5904]))
  np.testing.assert_allclose(np.asarray(prover.advantages(q_mu)[0]),
                             np.asarray(adv), atol=1e-5)


@pytest.mark.parametrize("verifier,values,key", [
    (base.Verifier(None, "implicit", "outcome"), {}, "prm.model"),
    (base.Verifier(None, "head", "hard"), {}, "prm.target"),
    (base.Verifier(None, "generative", "soft", value_trained=False), {},
     "prm.value_weight"),
    (base.Verifier(None, "head", "prover", prover_k=8), {},
     "rl.pav.prover_k"),
    (None, {"advantage_estimator": "grpo"}, "rl.advantage_estimator"),
])
def test_pav_refuses_what_does_not_suit_it(verifier, values, key):
  method = _method("pav", verifier,
                   **{"advantage_estimator": "drgrpo", **values})
  with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
    method.check()


def test_pipeline_checks_the_planned_verifier_before_running(tmp_path):
  config = cli.load_config_file(os.path.join(ROOT, "configs", "pav.py") +
                                ":size=test")
  config.prm.model = "implicit"
  with pytest.raises(config_lib.ConfigError, match=r"prm\.model"):
    pipeline.run(config, str(tmp_path))
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


def test_prime_advantages_ignore_filtered_groups():
  rng = np.random.default_rng(3)
  batch = {
      "response_mask": jnp.asarray((rng.random((8, 6)) > 0.2)
                                   .astype(np.float32)),
      "implicit_rewards": jnp.asarray(rng.normal(size=(8, 6))
                                      .astype(np.float32)),
      "rewards": jnp.asarray([1, 0, 0, 1, 1, 1, 0, 1], jnp.float32),
  }
  method = _method("prime", group_size=2)
  keep = np.array([1, 1, 0, 0, 1, 1, 0, 0], np.float32)  # groups 0 and 2.
  filtered = dict(batch, response_mask=batch["response_mask"] *
                  keep[:, None])
  got, _ = method.advantages(filtered)
  alone = {k: v[keep > 0] for k, v in batch.items()}
  want, _ = method.advantages(alone)
  np.testing.assert_allclose(np.asarray(got)[keep > 0], np.asarray(want),
                             atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got)[keep == 0], 0.0)


def test_pure_hard_min_form_returns_are_the_minimum():
  # One row, 3 steps, rewards 2p − 1 = [0.6, −0.2, 0.4]; the running min
  # returns are [−0.2, −0.2, 0.4], the paper's form zeros after the first
  # argmin: [−0.2, −0.2, 0].
  batch = {"step_scores": jnp.array([[0.8, 0.4, 0.7]]),
           "step_ids": jnp.array([[-1, 0, 0, 1, 2, 2]])}
  for credit, want in (("min", [-0.2, -0.2, 0.4]),
                       ("min_paper", [-0.2, -0.2, 0.0])):
    method = _method("pure", **{"pure.credit": credit})
    rewards, temperature = method.step_rewards(batch)
    assert temperature is None
    returns = np.cumsum(np.asarray(rewards)[0][::-1])[::-1]
    np.testing.assert_allclose(returns, want, atol=1e-6)


def test_pure_masks_inner_delimiters_of_a_merged_last_step():
  # Step ids 0, 1, 2, 3 with S = 2 slots: steps 1-3 merge into slot 1.
  raw = jnp.array([[0, 0, 1, 1, 2, 2, 3, 3]] * 2)
  batch = {"step_scores": jnp.array([[0.9, 0.2], [0.3, 0.8]]),
           "step_ids": base.clamp_step_ids(raw, 2),
           "step_end_mask": rl.core.step_end_mask_from_ids(raw),
           "response_mask": jnp.ones((2, 8)),
           "rewards": jnp.array([1.0, 0.0])}
  adv, _ = _method("pure", group_size=2).advantages(batch)
  # Every delimiter (positions 1, 3, 5, 7) gets no advantage, the inner
  # ones of the merged slot (3, 5) included; content tokens do.
  np.testing.assert_array_equal(np.asarray(adv)[:, [1, 3, 5, 7]], 0.0)
  assert np.all(np.asarray(adv)[:, [2, 4, 6]] != 0.0)


def test_reinforce_pp_puts_the_kl_in_the_reward():
  rng = np.random.default_rng(1)
  mask = jnp.ones((4, 5))
  batch = {"response_mask": mask,
           "rewards": jnp.array([1.0, 0.0, 1.0, 0.0]),
           "old_logprobs": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32),
           "ref_logprobs": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)}
  method = _method("reinforce_pp", group_size=1,
                   **{"reinforce_pp.reward_kl_coef": 0.1})
  assert method.reads_reference
  got, _ = method.advantages(batch)
  # Naive: r_t = outcome·1[t = 4] − 0.1·(old − ref), G = reverse cumsum,
  # whitened with the unbiased variance over all 20 tokens.
  r = -0.1 * (np.asarray(batch["old_logprobs"]) -
              np.asarray(batch["ref_logprobs"]))
  r[:, -1] += np.asarray(batch["rewards"])
  g = np.cumsum(r[:, ::-1], axis=1)[:, ::-1]
  want = (g - g.mean()) / np.sqrt(g.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_oracle_step_arrays():
  arrays = step_scores.oracle_step_arrays([[True, True, False, True], [True]],
                                          3)
  np.testing.assert_array_equal(arrays["labels"], [[1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(arrays["q_values"], [[1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(arrays["v_init"], [1, 1])


def _critic_batch():
  # One group of 4: rewards [1, 1, 0, 0]. Row 0 is clean on its two steps
  # (slot 2, past its last step, scores 0.1 and is not read); row 1 has a
  # step below ½ (flawed); row 2 is wrong and flawed, row 3 wrong and clean.
  return {
      "response_mask": jnp.array([[0, 1, 1, 1]] * 4),
      "step_ids": jnp.array([[-1, 0, 1, 1], [-1, 0, 1, 2],
                             [-1, 0, 0, 0], [-1, 0, 1, 1]]),
      "rewards": jnp.array([1.0, 1.0, 0.0, 0.0]),
      "step_scores": jnp.array([[0.9, 0.6, 0.1], [0.9, 0.2, 0.7],
                                [0.3, 0.9, 0.9], [0.8, 0.8, 0.8]]),
  }


def test_fapo_penalises_flawed_positives_hand_computed():
  # R = [+1, +1 − λ, −1, −1] with λ = 1: [1, 0, −1, −1].
  # GRPO: mean −0.25, deviations [1.25, 0.25, −0.75, −0.75], unbiased std
  # sqrt(2.75 / 3) = 0.957427: A = [1.30558, 0.26112, −0.78335, −0.78335].
  # The unpenalised ±1 reward: ±1 / sqrt(4/3) = ±0.866025.
  method = _method("fapo", advantage_estimator="grpo")
  np.testing.assert_array_equal(np.asarray(method.flawed(_critic_batch())),
                                [False, True, True, False])
  adv, parts = method.advantages(_critic_batch())
  want = np.array([1.30558, 0.26112, -0.78335, -0.78335])
  np.testing.assert_allclose(np.asarray(adv)[:, 1:], want[:, None] *
                             np.ones((4, 3)), atol=1e-4)
  np.testing.assert_array_equal(np.asarray(adv)[:, 0], 0.0)
  outcome = np.array([1, 1, -1, -1]) * 0.866025
  np.testing.assert_allclose(np.asarray(parts["outcome"])[:, 1],
                             outcome, atol=1e-4)
  np.testing.assert_allclose(np.asarray(parts["process"])[:, 1],
                             want - outcome, atol=1e-4)
  # Dr. GRPO: no std, R − mean = [1.25, 0.25, −0.75, −0.75]; λ = 0.5 gives
  # R = [1, 0.5, −1, −1], mean −0.125.
  drgrpo, _ = _method("fapo", advantage_estimator="drgrpo").advantages(
      _critic_batch())
  np.testing.assert_allclose(np.asarray(drgrpo)[:, 1],
                             [1.25, 0.25, -0.75, -0.75], atol=1e-6)
  half, _ = _method("fapo", advantage_estimator="drgrpo",
                    **{"fapo.penalty": 0.5}).advantages(_critic_batch())
  np.testing.assert_allclose(np.asarray(half)[:, 1],
                             [1.125, 0.625, -0.875, -0.875], atol=1e-6)


def test_capo_penalises_the_tokens_of_wrong_steps_hand_computed():
  # Groups of 2. Dr. GRPO: Â = r − mean = ±0.5; W_whole = 2, W_process = 1.
  # Row 0 (correct) has its step 1 wrong, row 1 (wrong) its step 0;
  # rows 2 and 3 of the second group are all 0.9 (no penalty), Â = 0.
  batch = {
      "response_mask": jnp.array([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0],
                                  [0, 1, 1, 1, 1], [0, 1, 1, 1, 1]]),
      "step_ids": jnp.array([[-1, 0, 0, 1, 1], [-1, 0, 1, 1, -1],
                             [-1, 0, 0, 1, 1], [-1, 0, 1, 1, 1]]),
      "rewards": jnp.array([1.0, 0.0, 1.0, 1.0]),
      "step_scores": jnp.array([[0.9, 0.3], [0.2, 0.8], [0.9, 0.9],
                                [0.9, 0.9]]),
  }
  values = {"group_size": 2, "capo.w_whole": 2.0, "capo.w_process": 1.0}
  adv, parts = _method("capo", advantage_estimator="drgrpo",
                       **values).advantages(batch)
  np.testing.assert_allclose(np.asarray(adv), [
      [0, 1, 1, 1 - 1, 1 - 1],
      [0, -1 - 1, -1, -1, 0],
      [0, 0, 0, 0, 0],
      [0, 0, 0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(parts["process"])[:2], [
      [0, 0, 0, -1, -1], [0, -1, 0, 0, 0]], atol=1e-6)
  # GRPO: Â = ±0.5 / std([1, 0], ddof=1) = ±0.707107.
  grpo, _ = _method("capo", advantage_estimator="grpo", **values).advantages(
      batch)
  np.testing.assert_allclose(np.asarray(grpo)[0],
                             [0, 1.414214, 1.414214, 0.414214, 0.414214],
                             atol=1e-5)


def test_capo_votes_over_sampled_critiques_hand_computed():
  # One group of 2, Dr. GRPO Â = ±0.5, W_whole = 2, W_process = 1. Three
  # critiques of two steps: step 0 of row 0 is marked by 2 of 3 (majority
  # yes, intersection no), step 1 by 3 of 3; row 1's step 0 by 1 of 3.
  batch = {
      "response_mask": jnp.array([[0, 1, 1, 1], [0, 1, 1, 1]]),
      "step_ids": jnp.array([[-1, 0, 1, 1], [-1, 0, 0, 1]]),
      "rewards": jnp.array([1.0, 0.0]),
      "step_scores": jnp.array([[0.9, 0.9], [0.9, 0.9]]),  # Not read.
      "critique_flags": jnp.array([[[1, 1], [1, 1], [0, 1]],
                                   [[1, 0], [0, 0], [0, 0]]], bool),
  }
  values = {"group_size": 2, "capo.w_whole": 2.0, "capo.w_process": 1.0,
            "capo.critiques": 3}
  rows = {}
  for voting in ("majority", "intersection", "average"):
    adv, _ = _method("capo", advantage_estimator="drgrpo",
                     **{**values, "capo.voting": voting}).advantages(batch)
    rows[voting] = np.asarray(adv)
  np.testing.assert_allclose(rows["majority"],
                             [[0, 0, 0, 0], [0, -1, -1, -1]], atol=1e-6)
  np.testing.assert_allclose(rows["intersection"],
                             [[0, 1, 0, 0], [0, -1, -1, -1]], atol=1e-6)
  np.testing.assert_allclose(rows["average"],
                             [[0, 1 - 2 / 3, 0, 0],
                              [0, -1 - 1 / 3, -1 - 1 / 3, -1]], atol=1e-6)


def test_mrt_gives_each_step_its_progress_hand_computed():
  # One group of 2, Dr. GRPO: ±0.5; α = 2. Row 0: J = [0.2, 0.5] after its
  # two steps, J(question) = 0.25; row 1 one step, J = 0.6 (slot 1 unread),
  # J(question) = 0.4.
  batch = {
      "response_mask": jnp.array([[0, 1, 1, 1, 1], [0, 1, 1, 0, 0]]),
      "step_ids": jnp.array([[-1, 0, 0, 1, 1], [-1, 0, 0, -1, -1]]),
      "rewards": jnp.array([1.0, 0.0]),
      "q_values": jnp.array([[0.2, 0.5], [0.6, 0.9]]),
      "v_init": jnp.array([0.25, 0.4]),
  }
  values = {"group_size": 2, "advantage_estimator": "drgrpo",
            "mrt.alpha": 2.0}
  # previous: progress [−0.05, 0.3] and [0.2].
  adv, parts = _method("mrt", **values).advantages(batch)
  np.testing.assert_allclose(np.asarray(adv), [
      [0, 0.4, 0.4, 1.1, 1.1], [0, -0.1, -0.1, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(parts["outcome"]), [
      [0, 0.5, 0.5, 0.5, 0.5], [0, -0.5, -0.5, 0, 0]], atol=1e-6)
  # prompt: progress [−0.05, 0.25] (each step against J(question)).
  prompt, _ = _method("mrt", **values,
                      **{"mrt.reference": "prompt"}).advantages(batch)
  np.testing.assert_allclose(np.asarray(prompt)[0], [0, 0.4, 0.4, 1.0, 1.0],
                             atol=1e-6)
  # The step checker's prover (J = 1 until the first wrong step, V = 1):
  # the first wrong step loses α, and under "prompt" every step after too.
  oracle = dict(batch, step_ids=jnp.array([[-1, 0, 1, 2, 2]] * 2),
                response_mask=jnp.array([[0, 1, 1, 1, 1]] * 2),
                q_values=jnp.array([[1.0, 0.0, 0.0]] * 2),
                v_init=jnp.ones((2,)))
  got, _ = _method("mrt", **values).advantages(oracle)
  np.testing.assert_allclose(np.asarray(got)[0], [0, 0.5, -1.5, 0.5, 0.5],
                             atol=1e-6)
  got, _ = _method("mrt", **values, **{"mrt.reference": "prompt"}
                   ).advantages(oracle)
  np.testing.assert_allclose(np.asarray(got)[0], [0, 0.5, -1.5, -1.5, -1.5],
                             atol=1e-6)


@pytest.mark.parametrize("verifier,key", [
    (base.Verifier(None, "implicit", "outcome"), "prm.model"),
    (base.Verifier(None, "generative", "progress"), "prm.target"),
    (base.Verifier(None, "head", "soft", value_trained=False),
     "prm.value_weight"),
])
def test_mrt_refuses_a_verifier_without_success_values(verifier, key):
  method = _method("mrt", verifier, prm_source="model")
  with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
    method.check()
  _method("mrt", base.Verifier(None, "head", "soft")).check()


@pytest.mark.parametrize("key,value", [
    ("fapo.threshold", 0.0), ("fapo.penalty", -1.0),
    ("capo.w_process", 2.0), ("capo.threshold", 1.5),
    ("capo.critiques", 0), ("capo.voting", "mean"),
    ("mrt.reference", "next"), ("mrt.alpha", -0.5)])
def test_critique_and_progress_keys_are_checked(key, value):
  config = config_lib.base_config()
  section, _, name = key.partition(".")
  config.rl[section][name] = value
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.rl\." + key.replace(".", r"\.")):
    config_lib.validate(config)


# --------------- PROF, Posterior-GRPO, Trust-GRPO, PPO with step rewards ---


def _two_step_group():
  # One group of 4, every response two steps on tokens 1-2 and 3-4.
  return {"response_mask": jnp.ones((4, 5)).at[:, 0].set(0),
          "step_ids": jnp.array([[-1, 0, 0, 1, 1]] * 4)}


def test_prof_keeps_the_consistent_rows_and_normalises_over_them():
  # Rewards [1, 1, 1, 0]; step scores [.9, .9], [.9, .3], [.5, .5], [.8, .8].
  # p̄ = 5.6 / 8 = 0.7, c_i = ±(1/2) Σ_k 2(p_k − p̄):
  # c = [0.4, −0.2, −0.4, −0.2] (the wrong row's sign flipped).
  # N+ = 3, N− = 1, R = 2: r+ = round((3 − 1 + 2)/2) = 2, r− = 0: the two
  # lowest correct rows (2, then 1) are dropped. GRPO over rows 0 and 3
  # (rewards 1, 0): mean 0.5, std sqrt(0.5): A = ±0.707107.
  batch = dict(_two_step_group(),
               rewards=jnp.array([1.0, 1.0, 1.0, 0.0]),
               step_scores=jnp.array([[0.9, 0.9], [0.9, 0.3], [0.5, 0.5],
                                      [0.8, 0.8]]))
  method = _method("prof", **{"prof.num_remove": 2})
  method.check()
  state, extra, record = method.signals(None, {}, {}, batch)
  assert state == {}
  np.testing.assert_array_equal(np.asarray(extra["prof_keep"]), [1, 0, 0, 1])
  np.testing.assert_array_equal(np.asarray(extra["response_mask"]),
                                [[0, 1, 1, 1, 1], [0] * 5, [0] * 5,
                                 [0, 1, 1, 1, 1]])
  assert record["train/prof_kept_fraction"] == 0.5
  adv, parts = method.advantages(dict(batch, **extra))
  want = np.array([0.707107, 0, 0, -0.707107])[:, None] * np.asarray(
      extra["response_mask"])
  np.testing.assert_allclose(np.asarray(adv), want, atol=1e-5)
  # The outcome part: GRPO over all four rows, [0.5, 0.5, 0.5, −1.5] (std
  # 0.5), on the kept rows' tokens; the process part is what the filter
  # changed.
  np.testing.assert_allclose(np.asarray(parts["outcome"])[[0, 3], 1],
                             [0.5, -1.5], atol=1e-5)
  np.testing.assert_allclose(np.asarray(parts["process"])[[0, 3], 1],
                             [0.207107, 0.792893], atol=1e-5)
  # Removing none is GRPO.
  none = _method("prof", **{"prof.num_remove": 0})
  _, kept, _ = none.signals(None, {}, {}, batch)
  got, _ = none.advantages(dict(batch, **kept))
  np.testing.assert_allclose(np.asarray(got)[:, 1], [0.5, 0.5, 0.5, -1.5],
                             atol=1e-5)


def test_prof_refuses_removing_a_whole_group():
  with pytest.raises(config_lib.ConfigError, match=r"rl\.prof\.num_remove"):
    _method("prof", **{"prof.num_remove": 4}).check()
  with pytest.raises(config_lib.ConfigError,
                     match=r"rl\.advantage_estimator"):
    _method("prof", advantage_estimator="drgrpo").check()


def test_posterior_grpo_rewards_thinking_only_when_correct():
  # Rewards [1, 1, 0, 0]; mean step scores 0.7 ([.9, .5]), 0.4 (one step),
  # 0.9 and 0.2 (wrong: not read). R = [1.7, 1.4, 0, 0], mean 0.775,
  # unbiased std 0.903235: A = [1.02410, 0.69196, −0.85803, −0.85803].
  batch = {"response_mask": jnp.ones((4, 5)).at[:, 0].set(0),
           "step_ids": jnp.array([[-1, 0, 0, 1, 1], [-1, 0, 0, 0, 0],
                                  [-1, 0, 0, 1, 1], [-1, 0, 0, 1, 1]]),
           "rewards": jnp.array([1.0, 1.0, 0.0, 0.0]),
           "step_scores": jnp.array([[0.9, 0.5], [0.4, 0.99], [0.9, 0.9],
                                     [0.1, 0.3]])}
  method = _method("posterior_grpo")
  np.testing.assert_allclose(np.asarray(method.rewards(batch)),
                             [1.7, 1.4, 0, 0], atol=1e-6)
  adv, parts = method.advantages(batch)
  np.testing.assert_allclose(np.asarray(adv)[:, 1:], np.array(
      [1.02410, 0.69196, -0.85803, -0.85803])[:, None] * np.ones((4, 4)),
                             atol=1e-4)
  np.testing.assert_array_equal(np.asarray(adv)[:, 0], 0.0)
  # Outcome alone: ±1 / sqrt(4/3).
  np.testing.assert_allclose(np.asarray(parts["outcome"])[:, 1],
                             [0.866025, 0.866025, -0.866025, -0.866025],
                             atol=1e-5)


def test_trust_grpo_anneals_by_the_rl_step_and_distrusts_hacked_groups():
  # Answers [1, .6, .3, 0] (correct: a ≥ 0.5) and mean step scores h =
  # [.3, .3, .8, .9]; row 3 (a < 0.2) is not judged: h' = [.3, .3, .8, 0].
  # μ_c = 0.3 < μ_w = 0.4: trust = e^{−0.1}. RL step 100 (200 policy
  # updates, 2 per step): w = 0.3·e^{−100/500}·e^{−0.1} = 0.222245, r =
  # [1.066674, 0.666674, 0.477796, 0]; GRPO: [1.16051, 0.25719, −0.16935,
  # −1.24835]. The second group (all solved) keeps its outcome: A = 0.
  batch = {"response_mask": jnp.ones((8, 5)).at[:, 0].set(0),
           "step_ids": jnp.array([[-1, 0, 0, 1, 1]] * 8),
           "rewards": jnp.array([1.0, 0.6, 0.3, 0.0, 1.0, 1.0, 1.0, 1.0]),
           "step_scores": jnp.array([[0.2, 0.4], [0.3, 0.3], [0.9, 0.7],
                                     [0.9, 0.9]] * 2)}
  method = _method("trust_grpo", minibatches=2)
  policy = dataclasses.make_dataclass("Policy", ["step"])(jnp.int32(200))
  _, extra, record = method.signals(None, {}, {"policy": policy}, batch)
  assert int(extra["rl_step"]) == 100
  assert record["train/trust_weight_scale"] == pytest.approx(
      0.3 * np.exp(-0.2), rel=1e-5)
  batch = dict(batch, **extra)
  rewards, weights = method.rewards(batch)
  np.testing.assert_allclose(np.asarray(rewards)[:4],
                             [1.066674, 0.666674, 0.477796, 0], atol=1e-5)
  np.testing.assert_allclose(np.asarray(weights)[:4], 0.222245, atol=1e-6)
  adv, _ = method.advantages(batch)
  np.testing.assert_allclose(np.asarray(adv)[:4, 1], [1.16051, 0.25719,
                                                      -0.16935, -1.24835],
                             atol=1e-4)
  np.testing.assert_array_equal(np.asarray(adv)[4:], 0.0)


def test_ppo_with_prm_step_rewards_hand_computed():
  # Row 0: steps on tokens 1-2 and 3-4 scored [0.8, 0.4], reward 1; row 1:
  # one step on tokens 1-3 scored 0.5, reward 0. Token rewards (step score
  # on its last token, + outcome on the last): row 0 [0, 0, .8, 0, 1.4],
  # row 1 [0, 0, 0, .5, 0]. γ = λ = 1: returns G_t = Σ_{t' ≥ t} R,
  # advantages G − V with V = 0.5 on every token.
  batch = {"response_mask": jnp.array([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0]],
                                      jnp.float32),
           "step_ids": jnp.array([[-1, 0, 0, 1, 1], [-1, 0, 0, 0, -1]]),
           "step_scores": jnp.array([[0.8, 0.4], [0.5, 0.9]]),
           "rewards": jnp.array([1.0, 0.0]),
           "values": jnp.full((2, 5), 0.5)}
  values = {"gae_gamma": 1.0, "ppo.gae_lambda": 1.0, "ppo.reward": "prm"}
  method = _method("ppo", **values)
  assert method.reads_step_scores
  assert not _method("ppo").reads_step_scores
  _, returns = ppo.gae(method.cfg, batch)
  want = np.array([[0, 2.2, 2.2, 1.4, 1.4], [0, 0.5, 0.5, 0.5, 0]])
  np.testing.assert_allclose(np.asarray(returns), want, atol=1e-6)
  adv, parts = method.advantages(batch)
  mask = np.asarray(batch["response_mask"]) > 0
  np.testing.assert_allclose(np.asarray(adv),
                             ref.whiten_reference(want - 0.5, mask),
                             atol=1e-5)
  # The outcome part: the outcome alone, [1, 1, 1, 1] and [0, 0, 0] − V.
  outcome = np.array([[0, 1, 1, 1, 1], [0, 0, 0, 0, 0]]) - 0.5
  np.testing.assert_allclose(np.asarray(parts["outcome"]),
                             ref.whiten_reference(outcome, mask), atol=1e-5)
  # The step rewards' weight: 2·[.8, .4] + 1 from token 1.
  double = _method("ppo", **values, **{"ppo.step_reward_coef": 2.0})
  assert float(ppo.gae(double.cfg, batch)[1][0, 1]) == pytest.approx(3.4)


def test_ppo_reads_the_verifier_only_with_prm_rewards():
  config = config_lib.base_config()
  config.rl.method = "ppo"
  config.rl.prm_source = "model"
  verifier = base.Verifier(None, "head", "soft")
  assert methods.make(config, verifier).verifier is None
  config.rl.ppo.reward = "prm"
  assert methods.make(config, verifier).verifier is verifier
  config.rl.ppo.reward = "value"
  with pytest.raises(config_lib.ConfigError, match=r"rl\.ppo\.reward"):
    config_lib.validate(config)
