"""The RL loop's own pieces: π_old, update metrics, advantage diagnostics."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.rollout import sampler
from rl_rewards.runners import programs
from rl_rewards.runners import rl
from rl_rewards.runners import rl_metrics

VOCAB = 13
CFG = models.preset("test", VOCAB)
PROMPTS = np.array([[1, 4, 7, 3, 9], [0, 0, 1, 5, 11]], np.int32)
PROMPT_MASK = (np.arange(5)[None] >= np.array([[0], [2]])).astype(np.int32)


def _config(**rl_values):
  config = config_lib.base_config()
  config.model.size = "test"
  for key, value in rl_values.items():
    config.rl[key] = value
  return config


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0))


def _sample(params, temperature):
  return sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(7),
                        max_new_tokens=8, temperature=temperature, eos_id=2,
                        pad_id=0, num_samples=4)


def test_sampler_log_probs_are_the_update_forward_pass_in_float32(params):
  # float32 at τ = 1: "auto" keeps the sampler's log-probs, because the
  # update's forward pass gives the same numbers.
  config = _config()
  assert not rl.recompute_old_logprobs(config)
  out = _sample(params, 1.0)
  update_pass = programs.logprob_pass(
      config, CFG, temperature=programs.update_temperature(config.rl))
  recomputed = update_pass(params, out.tokens, out.attention_mask)
  response = np.asarray(out.response_mask) > 0
  np.testing.assert_allclose(np.asarray(out.logprobs)[response],
                             np.asarray(recomputed)[response], atol=2e-5)


def test_tempered_rollouts_recompute_pi_old_at_the_sampled_temperature(
    params):
  config = _config(temperature=0.5)
  assert rl.recompute_old_logprobs(config)
  out = _sample(params, 0.5)
  response = np.asarray(out.response_mask) > 0
  tempered = programs.logprob_pass(
      config, CFG, temperature=programs.update_temperature(config.rl))(
          params, out.tokens, out.attention_mask)
  want = models.token_logprobs(CFG, params, out.tokens, out.attention_mask,
                               temperature=0.5)
  np.testing.assert_allclose(np.asarray(tempered)[response],
                             np.asarray(want)[response], atol=2e-5)
  # The sampler reports the untempered log-prob: as π_old it would bias
  # the ratio of every token.
  gap = np.abs(np.asarray(out.logprobs) - np.asarray(tempered))[response]
  assert gap.max() > 0.05


@pytest.mark.parametrize("section,key,value,recompute", [
    ("rl", "old_logprobs", "recompute", True),
    ("rl", "old_logprobs", "sampler", False),
    ("rl", "sampler_dtype", "bfloat16", True),
    ("rl", "top_p", 0.9, True),
    ("rl", "temperature", 0.0, False),  # Greedy: logits / 1.
    ("model", "dtype", "bfloat16", True),
])
def test_when_pi_old_is_recomputed(section, key, value, recompute):
  config = _config()
  config[section][key] = value
  assert rl.recompute_old_logprobs(config) == recompute


def test_update_metrics_are_averaged_over_every_minibatch():
  records = [{"loss": 1.0, "clipfrac": 0.0, "skipped": 0.0},
             {"loss": 3.0, "clipfrac": 0.5, "skipped": 1.0},
             {"loss": 2.0, "clipfrac": 0.1, "skipped": 1.0}]
  got = rl_metrics.mean_update_metrics(records)
  assert got == pytest.approx({"loss": 2.0, "clipfrac": 0.2, "skipped": 2.0})


def test_advantage_diagnostics_hand_computed():
  mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
  outcome = jnp.array([[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
  process = jnp.array([[0.0, 0.5, 0.0, 9.0], [0.0, 0.0, 0.0, 9.0]])
  got = rl_metrics.advantage_diagnostics(outcome + process,
                                 {"outcome": outcome, "process": process},
                                 mask)
  valid = np.asarray(mask) > 0
  total = np.asarray(outcome + process)[valid]  # [1, 1.5, 1, −1, −1]
  assert float(got["train/nonzero_advantage_fraction"]) == 1.0
  np.testing.assert_allclose(got["train/advantage_var"], total.var(),
                             rtol=1e-6)
  np.testing.assert_allclose(got["train/advantage_var_process"],
                             np.var([0, 0.5, 0, 0, 0]), rtol=1e-6)
  np.testing.assert_allclose(got["train/advantage_var_outcome"], 0.96,
                             rtol=1e-6)
  zero = rl_metrics.advantage_diagnostics(process * 0, {}, mask)
  assert float(zero["train/nonzero_advantage_fraction"]) == 0.0


def test_first_error_agreement():
  # Row 0: scores flag step 1 first, the checker says step 1: agree.
  # Row 1: scores flag nothing, the checker says step 0: disagree.
  # Row 2: both say "no error": agree.
  scores = np.array([[0.9, 0.2, 0.1], [0.9, 0.8, 0.7], [0.6, 0.7, 0.0]])
  step_ids = np.array([[0, 1, 2], [0, 1, 2], [0, 0, 1]])
  labels = np.array([[1, 0, 0], [0, 1, 1], [1, 1, 0]], np.float32)
  got = rl_metrics.prm_agreement_metrics(scores, step_ids, labels,
                                 np.array([0.0, 0.0, 1.0]))
  assert got["prm/first_error_agreement"] == pytest.approx(2 / 3)


def test_process_signal_metrics_hand_computed():
  # Row 0: first wrong step 1, lowest process advantage on step 1: blamed,
  #        negative there.
  # Row 1: first wrong step 0, lowest on step 2 (−0.5 < −0.1): not blamed,
  #        but negative on step 0.
  # Row 2: every step right, a negative value on step 1: credit taken.
  # Row 3: every step right, no process signal at all.
  # Row 4: a wrong step, but filtered out of the update: ignored.
  # Slot 2 of rows 0 and 3 is past their last step and is ignored.
  process = np.array([[0.2, -0.3, -9.0], [-0.1, 0.0, -0.5],
                      [0.0, -0.2, 0.1], [0.0, 0.0, -9.0],
                      [-1.0, 0.0, 0.0]])
  labels = np.array([[1, 0, 0], [0, 1, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0]],
                    np.float32)
  kept = np.array([True, True, True, True, False])
  num_steps = np.array([2, 3, 3, 2, 3])
  got = rl_metrics.process_signal_metrics(process, kept, labels, num_steps)
  assert got == pytest.approx({
      "train/process_signal_rows": 3 / 4,
      "train/process_blames_first_error": 1 / 2,
      "train/process_negative_at_first_error": 2 / 2,
      "train/process_negative_on_correct_rows": 1 / 2})


def test_rollout_metrics_count_all_wrong_and_all_right_groups():
  scored = types.SimpleNamespace(
      rewards=np.array([0, 0, 1, 0, 1, 1], np.float32),
      num_steps=np.array([2, 2, 2, 2, 2, 2]),
      step_labels=[[1, 0]] * 6, empty_steps=np.zeros(6))
  got = rl_metrics.rollout_metrics(scored, np.full(6, 10), group_size=2)
  assert got["train/all_wrong_groups"] == pytest.approx(1 / 3)
  assert got["train/all_right_groups"] == pytest.approx(1 / 3)
  assert got["train/zero_outcome_signal_groups"] == pytest.approx(2 / 3)
