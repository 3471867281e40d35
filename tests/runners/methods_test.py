"""Every RL method config runs at `test` size; method-specific invariants."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import credit
from rl_rewards.runners import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIGS = ("grpo", "drgrpo", "rloo", "ppo", "prime", "oracle", "pav", "pure",
           "clip_delta")


def _config(name, sft_dir, arg="", **overrides):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", f"{name}.py") +
      f":size=test,sft={sft_dir}" + (f",{arg}" if arg else ""))
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  return config


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sft"))
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "default.py") + ":size=test")
  config.stages = "sft"
  pipeline.run(config, workdir)
  return workdir


@pytest.mark.parametrize("name", CONFIGS)
def test_config_runs_two_rl_steps(name, sft_dir, tmp_path):
  summary = pipeline.run(_config(name, sft_dir), str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["train/loss"])
    for key in ("train/steps_per_response", "train/tokens_per_step",
                "train/empty_step_fraction", "time/rollout_s",
                "time/update_s", "time/prm_s", "perf/tokens_per_sec"):
      assert key in r, key


def test_a_nonfinite_policy_update_is_skipped_and_the_run_goes_on(sft_dir,
                                                                 tmp_path):
  summary = pipeline.run(_config("grpo", sft_dir, **{
      "debug.nonfinite_steps": "policy:1:grad_inf"}), str(tmp_path))
  assert summary["stages"]["rl"]["rl/skipped_updates"] == 1
  assert summary["stages"]["rl"]["rl/steps"] == 2
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert [r["train/skipped"] for r in records] == [1.0, 0.0]


def test_prime_implicit_rewards_are_zero_at_initialisation(sft_dir, tmp_path):
  # No accuracy filter: at `test` size every answer is wrong, and the filter
  # would drop every group from the PRM update.
  pipeline.run(_config("prime", sft_dir, **{"rl.filter_accuracy": False}),
               str(tmp_path))
  records = {r["step"]: r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r}
  # Step 1 scores the rollout with the implicit PRM before its first update:
  # π_φ = π_ref exactly, so every implicit reward is exactly 0.
  assert records[1]["prm/implicit_reward_abs_mean"] == 0.0
  # After one CE update the PRM differs from the reference.
  assert records[2]["prm/implicit_reward_abs_mean"] > 0.0


def _rl_records(workdir):
  return [{k: v for k, v in r.items() if k.startswith(("train/", "prm/"))}
          for r in metrics_lib.read_metrics(workdir)
          if r["stage"] == "rl" and "train/loss" in r]


def test_process_reward_stages_are_reused_across_runs(sft_dir, tmp_path):
  first = str(tmp_path / "pav")
  summary = pipeline.run(_config("pav", sft_dir), first)
  assert os.path.exists(os.path.join(first, "labels", "manifest.json"))
  # PURE on the same Monte-Carlo labels: the label set is read, not redone.
  second = str(tmp_path / "pure")
  pure = pipeline.run(_config("pure", sft_dir, f"labels={first}"), second)
  assert not os.path.exists(os.path.join(second, "labels"))
  assert (pure["stages"]["labels"]["labels/solutions"] ==
          summary["stages"]["labels"]["labels/solutions"])
  assert pure["stages"]["prm"]["prm/steps"] >= 1  # Its own (hard-label) PRM.
  # PAV with the first run's verifier: only sft and rl run, and the RL
  # stage is the same computation as in the first run.
  third = str(tmp_path / "pav_again")
  again = pipeline.run(_config("pav", sft_dir, f"prm={first}"), third)
  assert set(again["stages"]) == {"sft", "rl"}
  assert not os.path.exists(os.path.join(third, "checkpoints", "prm"))
  assert _rl_records(third) == _rl_records(first)


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
  return {
      "response_mask": jnp.asarray(response),
      "step_ids": jnp.asarray(step_ids),
      "rewards": jnp.asarray(rng.integers(0, 2, batch).astype(np.float32)),
      "q_steps": jnp.asarray(rng.random((batch, num_steps), np.float32)),
      "v_init": jnp.asarray(rng.random(batch).astype(np.float32)),
      "step_scores": jnp.asarray(rng.random((batch, num_steps), np.float32)),
  }


def _rl_config(**values):
  rl = config_lib.base_config().rl
  rl.group_size = 4
  for key, value in values.items():
    rl[key] = value
  return rl


def test_pav_with_zero_alpha_is_the_outcome_baseline():
  batch = _random_batch(np.random.default_rng(0))
  outcome = credit.outcome_advantages(_rl_config(), batch)
  pav = credit.pav_advantages(_rl_config(pav_alpha=0.0), batch)
  np.testing.assert_array_equal(np.asarray(pav), np.asarray(outcome))
  # And a nonzero alpha really adds a per-step term.
  pav1 = credit.pav_advantages(_rl_config(pav_alpha=1.0), batch)
  assert not np.allclose(np.asarray(pav1), np.asarray(outcome))


def test_pav_advantage_hand_computed():
  # One group of 2: rewards [1, 0] -> GRPO advantages ±0.7071 (unbiased std).
  # Row 0: 2 steps, Q^π = [0.5, 1.0], V^π = 0.5, K = 1, α = 2:
  #   A^μ = [0.5 − 0.5, 1.0 − 0.5] = [0, 0.5] -> tokens of step 1 get +1.
  batch = {
      "response_mask": jnp.array([[0, 1, 1, 1], [0, 1, 1, 0]]),
      "step_ids": jnp.array([[-1, 0, 1, 1], [-1, 0, 0, -1]]),
      "rewards": jnp.array([1.0, 0.0]),
      "q_steps": jnp.array([[0.5, 1.0], [0.2, 0.0]]),
      "v_init": jnp.array([0.5, 0.2]),
  }
  cfg = _rl_config(group_size=2, pav_alpha=2.0, prover_k=1)
  adv = np.asarray(credit.pav_advantages(cfg, batch))
  a = 1.0 / np.sqrt(2.0) / (1.0 + 1e-6 * np.sqrt(2.0))
  np.testing.assert_allclose(adv[0], [0, a, a + 1.0, a + 1.0], rtol=1e-5)
  np.testing.assert_allclose(adv[1], [0, -a, -a, 0], rtol=1e-5)


def test_oracle_step_arrays():
  arrays = credit.oracle_step_arrays([[True, True, False, True], [True]], 3)
  np.testing.assert_array_equal(arrays["labels"], [[1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(arrays["q_steps"], [[1, 1, 0], [1, 0, 0]])
  np.testing.assert_array_equal(arrays["rewards"], [[1, 1, -1], [1, -1, -1]])


class _Crash(Exception):
  pass


@pytest.mark.parametrize("name", ["ppo", "prime", "pav"])
def test_resume_mid_rl_reproduces_the_uninterrupted_run(name, sft_dir,
                                                        tmp_path, monkeypatch):
  overrides = {"rl.steps": 3, "rl.checkpoint_every_steps": 1}
  reference = str(tmp_path / "reference")
  pipeline.run(_config(name, sft_dir, **overrides), reference)
  original = metrics_lib.MetricsWriter.write

  def crash_at_step_2(self, stage, step, values):
    if stage == "rl" and step == 2 and "train/loss" in values:
      raise _Crash()
    return original(self, stage, step, values)

  resumed = str(tmp_path / "resumed")
  with monkeypatch.context() as patch:
    patch.setattr(metrics_lib.MetricsWriter, "write", crash_at_step_2)
    with pytest.raises(_Crash):
      pipeline.run(_config(name, sft_dir, **overrides), resumed)
  pipeline.run(_config(name, sft_dir, **overrides), resumed)

  assert _rl_records(resumed) == _rl_records(reference)


def test_sft_continued_baseline_runs_and_is_reused(sft_dir, tmp_path):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "default.py") + f":size=test,sft={sft_dir}")
  config.stages = "sft,sft_continue"
  config.sft.continue_seconds = 1.0
  config.sft.checkpoint_every_steps = 1  # The last step is a saved step too.
  workdir = str(tmp_path / "continue")
  summary = pipeline.run(config, workdir)
  stage = summary["stages"]["sft_continue"]
  assert stage["sft_continue/steps"] >= 1
  assert 0.0 <= stage["eval/accuracy"] <= 1.0
  again = pipeline.run(config, workdir)
  assert again["stages"]["sft_continue"] == stage
