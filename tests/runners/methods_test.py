"""Every RL method config runs at `test` size; method-specific invariants."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import methods
from rl_rewards.runners import pipeline
from rl_rewards.runners import rl
from rl_rewards.runners import step_scores
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.runners.methods import base
from rl_rewards.runners.methods import ppo
from tests.core import advantages_test as core_advantages_test
from tests.core import core_reference as ref
from tests.core import prime_test as core_prime_test
from tests.core import pure_test as core_pure_test
from tests.core import thoughts_test as core_thoughts_test

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# (config file, its argument): every method in the default suite, their
# variants under `-m slow`.
CONFIGS = (("grpo", ""), ("ppo", ""), ("prime", ""), ("oracle", ""),
           ("pav", ""), ("pure", ""), ("clip_delta", ""), ("reinforce_pp", ""),
           ("tp_grpo", ""), ("grpo_process", ""),
           *(pytest.param(*c, marks=pytest.mark.slow) for c in (
               ("drgrpo", ""), ("rloo", ""),
               ("prime", "rloo=paper,batch_norm=1"),
               ("oracle", "method=pure"), ("oracle", "method=tp_grpo"),
               ("pav", "verifier=generative"), ("pure", "credit=min"),
               ("pure", "credit=min_paper"),
               ("reinforce_pp", "baseline=group"))))
# FAPO, CAPO and MRT: the trained verifier or the step checker as critic,
# one of each in the default suite, the others under `-m slow`.
CONFIGS += (("fapo", ""), ("capo", "source=oracle"), ("mrt", ""),
            *(pytest.param(*c, marks=pytest.mark.slow) for c in (
                ("fapo", "source=oracle"), ("capo", ""),
                ("mrt", "source=oracle"),
                ("mrt", "source=oracle,reference=prompt"))))

# PROF, Posterior-GRPO, Trust-GRPO and PPO with PRM step rewards: the step
# checker's scores in the default suite, a trained verifier under `-m slow`.
CONFIGS += (("prof", "source=oracle"), ("posterior_grpo", "source=oracle"),
            ("trust_grpo", "source=oracle"),
            ("ppo", "reward=prm,source=oracle"),
            *(pytest.param(*c, marks=pytest.mark.slow) for c in (
                ("prof", ""), ("posterior_grpo", ""), ("trust_grpo", ""),
                ("ppo", "reward=prm"))))


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


@pytest.fixture
def mixed_outcomes(monkeypatch):
  """Every other rollout row is scored correct (every group is mixed).

  The `test`-size policy solves nothing, so every outcome advantage would be
  0; with mixed groups every method's advantage path carries a signal. The
  ground-truth step labels are left as they are.
  """
  original = tasks_lib.ArithTask.score

  def score(self, problems, texts, finished):
    scored = original(self, problems, texts, finished)
    rewards = np.asarray(scored.rewards).copy()
    rewards[::2] = 1.0
    return dataclasses.replace(scored, rewards=rewards.astype(np.float32))

  monkeypatch.setattr(tasks_lib.ArithTask, "score", score)


# ------------------------------------- naive advantages, from the batch ---
# Each reference recomputes a method's token advantages [B, T] from the
# batch the RL step handed to `advantages`, with the loop references of
# tests/core (no code shared with rl_rewards.core).


def _last_token(values, mask):
  """[B, T]: values[b] on row b's last valid token."""
  out = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    valid = np.flatnonzero(mask[b])
    if valid.size:
      out[b, valid[-1]] = values[b]
  return out


def _outcome_ref(cfg, batch, estimator=None):
  adv = ref.group_advantages_reference(
      batch["rewards"], cfg.group_size,
      estimator or cfg.advantage_estimator, eps=cfg.advantage_eps)
  return adv[:, None] * (batch["response_mask"] > 0)


def _on_steps(step_values, ids, mask):
  """[B, T]: step_values[b, ids[b, t]] on valid tokens, 0 elsewhere."""
  out = np.zeros(ids.shape)
  for b, t in zip(*np.nonzero((ids >= 0) & (mask > 0))):
    out[b, t] = step_values[b, ids[b, t]]
  return out


def _ppo_ref(cfg, config, batch):
  del config
  mask = batch["response_mask"] > 0
  rewards = _last_token(batch["rewards"], mask)
  if cfg.ppo.reward == "prm":  # Each step's score on its last token.
    ids = batch["step_ids"]
    for b in range(ids.shape[0]):
      for s in range(int(ids[b].max()) + 1):
        ends = np.flatnonzero((ids[b] == s) & mask[b])
        if ends.size:
          rewards[b, ends[-1]] += (cfg.ppo.step_reward_coef *
                                   batch["step_scores"][b, s])
  adv, _ = ref.gae_reference(rewards, batch["values"], mask, cfg.gae_gamma,
                             cfg.ppo.gae_lambda)
  return ref.whiten_reference(adv, mask)


def _reinforce_pp_ref(cfg, config, batch):
  del config
  mask = batch["response_mask"] > 0
  if cfg.reinforce_pp.baseline == "group":  # Centred in the group, whitened.
    centred = ref.group_advantages_reference(batch["rewards"],
                                             cfg.group_size, "drgrpo")
    return ref.whiten_reference(centred[:, None] * mask, mask)
  beta = cfg.reinforce_pp.reward_kl_coef
  rewards = _last_token(batch["rewards"], mask) - beta * (
      batch["old_logprobs"] - batch["ref_logprobs"]) * mask
  returns = ref.discounted_returns_reference(rewards, mask, cfg.gae_gamma)
  return ref.whiten_reference(returns, mask)


def _pav_ref(cfg, config, batch):
  ids, mask = batch["step_ids"], batch["response_mask"]
  k = cfg.pav.prover_k
  if cfg.prm_source == "model" and base.Verifier.planned(
      config).target == "prover":
    k = 1  # Its scores are Best-of-K values already.
  q_mu = 1 - (1 - batch["q_values"].astype(np.float64)) ** k
  v_mu = 1 - (1 - batch["v_init"].astype(np.float64)) ** k
  progress = np.zeros(q_mu.shape)
  for b in range(q_mu.shape[0]):
    previous = v_mu[b]
    for s in range(int(ids[b].max()) + 1):
      progress[b, s] = q_mu[b, s] - previous
      previous = q_mu[b, s]
  return _outcome_ref(cfg, batch) + cfg.pav.alpha * _on_steps(progress, ids,
                                                              mask)


def _pure_ref(cfg, config, batch):
  del config
  ids, mask, n = batch["step_ids"], batch["response_mask"], cfg.group_size
  assert cfg.pure.baseline == "token"
  step_mask = ref.step_mask_reference(ids, batch["step_scores"].shape[1])
  r = 2.0 * batch["step_scores"] - 1.0
  if cfg.pure.credit == "softmin":
    r = ref.softmin_reference(r, step_mask, cfg.pure.temperature)
  else:  # Step rewards whose returns are the hard min-form returns.
    returns = ref.running_min_reference(r, step_mask,
                                        paper=cfg.pure.credit == "min_paper")
    r = returns - np.concatenate([returns[:, 1:], np.zeros_like(
        returns[:, :1])], axis=1) * step_mask
  adjusted = core_pure_test._token_baseline_reference(r, ids, mask, n)  # pylint: disable=protected-access
  token_rewards = np.zeros(ids.shape)
  for b in range(ids.shape[0]):
    for s in range(int(ids[b].max()) + 1):
      token_rewards[b, np.flatnonzero(ids[b] == s)[-1]] += adjusted[b, s]
  verifiable = ref.group_advantages_reference(batch["rewards"] - 1.0, n,
                                              "rloo")
  token_rewards += (cfg.pure.verifiable_reward_coef *
                    _last_token(verifiable, mask))
  x = ref.reward_to_go_reference(token_rewards, mask > 0)
  if cfg.pure.mask_step_end_tokens:
    x = np.where(batch["step_end_mask"], 0.0, x)
  valid = x[mask > 0]  # PURE's normalisation: statistics of the non-zeros.
  nonzero = valid[valid != 0]
  if not nonzero.size:
    return np.zeros(x.shape)
  mean = nonzero.mean()
  rstd = 1 / np.sqrt(max(((valid - mean) ** 2).sum() / nonzero.size, 1e-8))
  return np.where((mask > 0) & (x != 0), (x - mean) * rstd, 0.0)


def _prime_ref(cfg, config, batch):
  del config
  mask, n = batch["response_mask"] > 0, cfg.group_size
  if cfg.prime.rloo_form != "code" or cfg.prime.batch_norm:
    return None  # The paper's forms: tests/core/prime_test.py.
  process = core_prime_test._masked_rloo_reference(  # pylint: disable=protected-access
      batch["implicit_rewards"], mask, n) * cfg.prime.process_coef
  outcome = ref.group_advantages_reference(batch["rewards"], n, "rloo")
  rewards = process + cfg.prime.outcome_coef * _last_token(outcome, mask)
  return ref.whiten_reference(ref.reward_to_go_reference(rewards, mask),
                              mask)


def _grpo_process_ref(cfg, config, batch):
  del config
  ids, scores = batch["step_ids"], batch["step_scores"]
  step_mask = ref.step_mask_reference(ids, scores.shape[1])
  process = core_advantages_test._process_reference(  # pylint: disable=protected-access
      scores, step_mask, ids, cfg.group_size, eps=cfg.advantage_eps)
  return _outcome_ref(cfg, batch) + cfg.process_coef * process


def _clip_delta_ref(cfg, config, batch):
  del config
  ids, scores = batch["step_ids"], batch["step_scores"]
  assert cfg.clip_delta.mode == "clip_delta"
  # Clip: min(r − η, 0); Delta: r_k − r_{k+1}, whose returns telescope to
  # the clipped reward of every step but the last, and 0 on the last.
  returns = np.zeros(scores.shape)
  for b in range(scores.shape[0]):
    last = int(ids[b].max())
    for s in range(last):
      returns[b, s] = min(scores[b, s] - cfg.clip_delta.eta, 0.0)
  return _outcome_ref(cfg, batch) + cfg.process_coef * _on_steps(
      returns, ids, batch["response_mask"])


def _tp_grpo_ref(cfg, config, batch):
  del config
  assert cfg.advantage_estimator == "grpo"
  return core_thoughts_test._reference(  # pylint: disable=protected-access
      batch["step_scores"], batch["step_ids"], batch["response_mask"],
      batch["rewards"], cfg.group_size, cfg.tp_grpo.alpha,
      eps=cfg.advantage_eps)


def _flagged_steps(scores, ids, threshold):
  """[B, S] bool: valid steps scored below `threshold`."""
  return ref.step_mask_reference(ids, scores.shape[1]) & (scores < threshold)


def _fapo_ref(cfg, config, batch):
  del config
  flawed = _flagged_steps(batch["step_scores"], batch["step_ids"],
                          cfg.fapo.threshold).any(axis=1)
  correct = batch["rewards"] > 0.5
  rewards = np.where(correct, 1.0, -1.0) - cfg.fapo.penalty * (correct &
                                                               flawed)
  adv = ref.group_advantages_reference(rewards, cfg.group_size,
                                       cfg.advantage_estimator,
                                       eps=cfg.advantage_eps)
  return adv[:, None] * (batch["response_mask"] > 0)


def _capo_ref(cfg, config, batch):
  del config
  ids, mask = batch["step_ids"], batch["response_mask"]
  wrong = _flagged_steps(batch["step_scores"], ids, cfg.capo.threshold)
  return (cfg.capo.w_whole * _outcome_ref(cfg, batch) -
          cfg.capo.w_process * _on_steps(wrong.astype(float), ids, mask))


def _mrt_ref(cfg, config, batch):
  del config
  ids, q, v = batch["step_ids"], batch["q_values"], batch["v_init"]
  progress = np.zeros(q.shape)
  for b in range(q.shape[0]):
    previous = v[b]
    for s in range(int(ids[b].max()) + 1):
      progress[b, s] = q[b, s] - previous
      if cfg.mrt.reference == "previous":
        previous = q[b, s]
  return _outcome_ref(cfg, batch) + cfg.mrt.alpha * _on_steps(
      progress, ids, batch["response_mask"])


def _mean_step_scores_ref(batch):
  """[B] mean step score of each response over its steps (0: none)."""
  scores, ids = batch["step_scores"], batch["step_ids"]
  valid = ref.step_mask_reference(ids, scores.shape[1])
  return np.array([scores[b][valid[b]].mean() if valid[b].any() else 0.0
                   for b in range(scores.shape[0])])


def _prof_keep_ref(cfg, batch):
  """[B] bool: PROF's kept rows, every row a valid sample."""
  p, n = cfg.prof, cfg.group_size
  scores, ids = batch["step_scores"].astype(np.float64), batch["step_ids"]
  valid = ref.step_mask_reference(ids, scores.shape[1])
  correct = batch["rewards"] > 0.5
  mean = scores[valid].mean() if valid.any() else 0.0
  critic = np.zeros(len(correct))
  for b in range(len(correct)):
    steps = valid[b].sum()
    c = 0.0 if steps == 0 else (2 * (scores[b][valid[b]] - mean)).sum() / steps
    c *= 1 if correct[b] else -1
    penalised = steps < p.min_steps or steps > p.max_steps
    critic[b] = c - p.length_penalty * penalised
  keep = np.ones(len(correct), bool)
  for g in range(0, len(correct), n):
    rows = list(range(g, g + n))
    pos = [i for i in rows if correct[i]]
    neg = [i for i in rows if not correct[i]]
    remove = min(p.num_remove, n)
    r_pos = min(max(round((len(pos) - len(neg) + remove) / 2), 0),
                min(remove, len(pos)))
    r_neg = min(remove - r_pos, len(neg))
    for members, r in ((pos, r_pos), (neg, r_neg)):
      for i in sorted(members, key=lambda i: (critic[i], i))[:r]:
        keep[i] = False
  return keep


def _prof_ref(cfg, config, batch):
  del config
  keep = _prof_keep_ref(cfg, batch)
  np.testing.assert_array_equal(batch["prof_keep"] > 0, keep)
  rewards, n = batch["rewards"].astype(np.float64), cfg.group_size
  adv = np.zeros(len(rewards))
  for g in range(0, len(rewards), n):
    kept = [i for i in range(g, g + n) if keep[i]]
    values = rewards[kept]
    if len(kept) == 1:
      adv[kept] = values / (1 + cfg.advantage_eps)
    elif len(kept) > 1 and values.max() > values.min():
      adv[kept] = (values - values.mean()) / (values.std(ddof=1) +
                                              cfg.advantage_eps)
  return adv[:, None] * (batch["response_mask"] > 0)


def _posterior_grpo_ref(cfg, config, batch):
  del config
  c = cfg.posterior_grpo
  outcome = batch["rewards"].astype(np.float64)
  rewards = outcome + np.where(outcome > c.correct_threshold,
                               c.thinking_coef * _mean_step_scores_ref(batch),
                               0.0)
  adv = ref.group_advantages_reference(rewards, cfg.group_size,
                                       cfg.advantage_estimator,
                                       eps=cfg.advantage_eps)
  return adv[:, None] * (batch["response_mask"] > 0)


def _trust_grpo_ref(cfg, config, batch):
  del config
  c, n = cfg.trust_grpo, cfg.group_size
  answers = batch["rewards"].astype(np.float64)
  thinking = _mean_step_scores_ref(batch)
  scale = c.base_weight * np.exp(-float(batch["rl_step"]) / c.anneal_steps)
  rewards = answers.copy()
  for g in range(0, len(answers), n):
    a, h = answers[g:g + n], thinking[g:g + n]
    if (a >= c.solved_threshold).all() or (a <= c.failed_threshold).all():
      continue  # Outcome only.
    judged = np.where(a >= c.judge_threshold, h, 0.0)
    right = a >= c.correct_threshold
    mean_right = judged[right].mean() if right.any() else 0.0
    mean_wrong = judged[~right].mean() if (~right).any() else 0.0
    trust = (np.exp(mean_right - mean_wrong)
             if right.any() and mean_right < mean_wrong else 1.0)
    rewards[g:g + n] = a + scale * trust * judged
  adv = ref.group_advantages_reference(rewards, n, cfg.advantage_estimator,
                                       eps=cfg.advantage_eps)
  return adv[:, None] * (batch["response_mask"] > 0)


def _gra_ref(cfg, config, batch):
  """G-RA by loops: R_b,k = r_b + 1[r_b >= threshold] * beta * (sum of the
  scores of steps k and later), minus the group mean of R_b,0."""
  del config
  ids, mask, n = batch["step_ids"], batch["response_mask"], cfg.group_size
  r = batch["rewards"].astype(np.float64)
  returns = np.zeros(batch["step_scores"].shape)
  for b in range(len(r)):
    last = int(ids[b].max())
    for k in range(last + 1):
      later = sum(batch["step_scores"][b, j] for j in range(k, last + 1))
      gated = cfg.gra.turn_reward * later if r[b] >= cfg.gra.threshold else 0
      returns[b, k] = r[b] + gated
  baseline = np.repeat(returns[:, 0].reshape(-1, n).mean(axis=1), n)
  return (_on_steps(returns, ids, mask) - baseline[:, None]) * (mask > 0)


_REFERENCES = {
    "outcome": lambda cfg, config, batch: _outcome_ref(cfg, batch),
    "ppo": _ppo_ref, "reinforce_pp": _reinforce_pp_ref, "pav": _pav_ref,
    "pure": _pure_ref, "prime": _prime_ref,
    "grpo_process": _grpo_process_ref, "clip_delta": _clip_delta_ref,
    "tp_grpo": _tp_grpo_ref,
    "prof": _prof_ref, "posterior_grpo": _posterior_grpo_ref,
    "trust_grpo": _trust_grpo_ref,
    "fapo": _fapo_ref, "capo": _capo_ref, "mrt": _mrt_ref,
    "gra": _gra_ref,
}


def _spy_on_advantages(monkeypatch, method_name):
  """Records (batch, advantages) of every RL step as host arrays."""
  seen = []
  cls = methods.METHODS[method_name]
  advantages = cls.advantages

  def spy(self, batch):  # Runs under jit: read the values back on the host.
    out = advantages(self, batch)
    jax.debug.callback(
        lambda b, a: seen.append(({k: np.asarray(v) for k, v in b.items()},
                                  np.asarray(a))), dict(batch), out[0])
    return out

  monkeypatch.setattr(cls, "advantages", spy)
  return seen


def test_every_method_has_a_reference():
  assert sorted(_REFERENCES) == sorted(methods.METHODS)


@pytest.mark.parametrize("name,arg", CONFIGS)
def test_config_runs_two_rl_steps(name, arg, sft_dir, tmp_path,
                                  mixed_outcomes, monkeypatch):
  del mixed_outcomes
  config = _config(name, sft_dir, arg)
  config.rl.filter_accuracy = False  # Keep every mixed group.
  seen = _spy_on_advantages(monkeypatch, config.rl.method)
  summary = pipeline.run(config, str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 2
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["train/loss"])
    for key in ("train/steps_per_response", "train/tokens_per_step",
                "train/empty_step_fraction", "time/rollout_s",
                "time/update_s", "time/prm_s", "perf/tokens_per_sec",
                "train/zero_outcome_signal_groups",
                "train/advantage_var"):
      assert key in r, key
  # The advantages of each step, recomputed from the batch it saw, and the
  # logged statistics recomputed from those arrays.
  assert len(seen) == len(records) == 2
  reference = _REFERENCES[config.rl.method]
  for r, (batch, got) in zip(records, seen):
    mask = batch["response_mask"] > 0
    # Every row takes part, but those PROF drops (no loss weight).
    kept = batch.get("prof_keep", np.ones(mask.shape[0])) > 0
    np.testing.assert_array_equal(mask.any(axis=1), kept)
    if "rl_step" in batch:  # Trust-GRPO anneals by the RL step, from 0.
      assert int(batch["rl_step"]) == r["step"] - 1
    want = reference(config.rl, config, batch)
    assert want is not None or arg  # Every default config has a reference.
    if want is not None:
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                 err_msg=f"{name} {arg} step {r['step']}")
      assert np.abs(want[mask]).max() > 0.1  # A signal to check.
    np.testing.assert_array_equal(got[~mask], 0.0)
    assert r["train/reward_mean"] == pytest.approx(batch["rewards"].mean())
    assert r["train/nonzero_advantage_fraction"] == pytest.approx(
        np.mean(np.abs(got[mask]) > 1e-8))
    assert r["train/advantage_var"] == pytest.approx(np.var(got[mask]),
                                                     rel=1e-3, abs=1e-6)
  if config.rl.method in ("pav", "pure", "clip_delta", "tp_grpo",
                          "grpo_process", "fapo", "capo", "mrt") and (
      config.rl.prm_source == "model"):
    assert "prm/first_error_agreement" in records[0]


def test_a_nonfinite_policy_update_is_skipped_and_the_run_goes_on(sft_dir,
                                                                 tmp_path):
  summary = pipeline.run(_config("grpo", sft_dir, **{
      "debug.nonfinite_steps": "policy:1:grad_inf"}), str(tmp_path))
  assert summary["stages"]["rl"]["rl/skipped_updates"] == 1
  assert summary["stages"]["rl"]["rl/steps"] == 2
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert [r["train/skipped"] for r in records] == [1.0, 0.0]


def test_consecutive_skipped_implicit_prm_updates_stop_the_run(sft_dir,
                                                              tmp_path):
  from rl_rewards.train import nonfinite  # pylint: disable=g-import-not-at-top
  config = _config("prime", sft_dir, **{
      "debug.nonfinite_steps": "implicit_prm:1-2:loss_nan",
      "train.max_consecutive_skips": 2, "rl.filter_accuracy": False})
  with pytest.raises(nonfinite.NonFiniteError, match=r"rl/implicit_prm.*2"):
    pipeline.run(config, str(tmp_path))


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
  assert "prm/step_label_agreement" in _rl_records(first)[0]
  assert "train/process_blames_first_error" in _rl_records(first)[0]
  # Without the oracle agreement log, the same run logs no agreement.
  fourth = str(tmp_path / "pav_quiet")
  pipeline.run(_config("pav", sft_dir, f"prm={first}",
                       **{"rl.log_oracle_agreement": False}), fourth)
  assert not any(k.startswith(("prm/", "train/process_"))
                 for k in _rl_records(fourth)[0])


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


class _Crash(Exception):
  pass


def _saved_state(workdir, stage="rl"):
  """{path: host array} of a stage's latest checkpoint: every model's
  parameters, optimizer state and counters."""
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", stage))
  restored = ckpt.restore_raw()
  ckpt.close()
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in
          jax.tree_util.tree_leaves_with_path(restored)}


@pytest.mark.parametrize("name", ["ppo", "prime", "pav"])
def test_resume_mid_rl_reproduces_the_uninterrupted_run(name, sft_dir,
                                                        tmp_path, monkeypatch,
                                                        mixed_outcomes):
  # Mixed groups and no accuracy filter: every step updates every model
  # (PRIME's implicit PRM and its policy, PPO's critic, the PAV policy).
  del mixed_outcomes
  overrides = {"rl.steps": 3, "rl.checkpoint_every_steps": 1,
               "rl.filter_accuracy": False}
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
  # The final states are equal bit for bit: parameters and optimizer states
  # of every model, step and skip counters.
  want, got = _saved_state(reference), _saved_state(resumed)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  assert any("opt_state" in key for key in want)
  # Real updates happened: every trained model moved from where it started
  # (the policy and PRIME's implicit PRM from the SFT parameters, PPO's
  # critic from the SFT backbone).
  start = _saved_state(sft_dir, "sft")
  models = sorted({key.split("]")[0] + "]" for key in want
                   if "['params']" in key and "opt_state" not in key})
  assert models == sorted({"ppo": ["['policy']", "['value']"],
                           "prime": ["['implicit_prm']", "['policy']"],
                           "pav": ["['policy']"]}[name])
  for model in models:
    prefix = model + "['params']"
    backbone = [key for key in want if key.startswith(prefix) and
                "['params']" + key[len(prefix):] in start]
    assert backbone, model
    assert any(not np.array_equal(want[key],
                                  start["['params']" + key[len(prefix):]])
               for key in backbone), model
  last = _rl_records(reference)[-1]
  assert last["train/skipped_updates"] == 0


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


def test_the_oracle_needs_a_task_with_step_labels():
  config = config_lib.base_config()
  config.task.name = "gsm8k"
  config.rl.method = "pav"
  config.rl.advantage_estimator = "drgrpo"
  config.rl.prm_source = "oracle"
  with pytest.raises(config_lib.ConfigError, match=r"rl\.prm_source"):
    methods.check_config(config)
  config.rl.method = "outcome"  # Reads no step scores: nothing to check.
  methods.check_config(config)


def test_prime_loop_filters_groups_before_its_advantages(sft_dir, tmp_path,
                                                         monkeypatch):
  # Rows 0-7 (groups 0-3 of 2 samples) all correct: mean 1 > 0.8, filtered
  # out; rows 8-15 alternate: mean 0.5, kept.
  original = tasks_lib.ArithTask.score

  def score(self, problems, texts, finished):
    scored = original(self, problems, texts, finished)
    rewards = np.zeros(len(texts), np.float32)
    rewards[:8] = 1.0
    rewards[8::2] = 1.0
    return dataclasses.replace(scored, rewards=rewards)

  seen = []
  advantages = methods.prime.PRIME.advantages

  def spy(self, batch):  # Runs under jit: read the mask back on the host.
    jax.debug.callback(lambda m: seen.append(np.asarray(m).sum(axis=1)),
                       batch["response_mask"])
    return advantages(self, batch)

  monkeypatch.setattr(tasks_lib.ArithTask, "score", score)
  monkeypatch.setattr(methods.prime.PRIME, "advantages", spy)
  config = _config("prime", sft_dir, **{"rl.steps": 1})
  assert config.rl.filter_accuracy and config.rl.group_size == 2
  pipeline.run(config, str(tmp_path))
  (mask_rows,) = seen
  # The advantages (their RLOO and whitening statistics) see the filtered
  # rows with an all-zero response mask, the kept rows as sampled.
  assert np.all(mask_rows[:8] == 0) and np.all(mask_rows[8:] > 0)
  records = [r for r in metrics_lib.read_metrics(str(tmp_path))
             if r["stage"] == "rl" and "train/loss" in r]
  assert records[0]["train/kept_fraction"] == 0.5


def test_a_refreshed_verifier_scores_the_next_rollout_anew(sft_dir, tmp_path,
                                                            mixed_outcomes):
  del mixed_outcomes
  trained = str(tmp_path / "pav")
  pipeline.run(_config("pav", sft_dir), trained)
  runs = {}
  for name, lr in (("fixed", 0.0), ("refreshed", 1e-2)):
    workdir = str(tmp_path / name)
    summary = pipeline.run(
        _config("pav", sft_dir, f"prm={trained}",
                **{"rl.verifier_refresh_lr": lr}), workdir)
    runs[name] = [r for r in metrics_lib.read_metrics(workdir)
                  if r["stage"] == "rl" and "train/loss" in r]
  fixed, refreshed = runs["fixed"], runs["refreshed"]
  # Step 1 is scored before any refresh: the same verifier, the same scores.
  assert refreshed[0]["prm/mean_step_score"] == fixed[0]["prm/mean_step_score"]
  assert "train/verifier_refresh/prm_loss" in refreshed[0]
  assert not any(k.startswith("train/verifier_refresh") for k in fixed[0])
  # Step 2 reads the verifier refreshed on step 1's rollout.
  assert refreshed[1]["prm/mean_step_score"] != fixed[1]["prm/mean_step_score"]
  assert summary["stages"]["rl"]["rl/verifier_skipped_updates"] == 0


def test_refreshing_a_verifier_that_does_not_predict_q_pi_is_refused(
    sft_dir, tmp_path):
  # Before any stage runs: PURE's verifier is trained on progress labels,
  # GRPO reads no verifier.
  for name in ("pure", "grpo"):
    with pytest.raises(config_lib.ConfigError, match="verifier_refresh_lr"):
      pipeline.run(_config(name, sft_dir, **{"rl.verifier_refresh_lr": 1e-3}),
                   str(tmp_path / name))
    assert not os.path.exists(tmp_path / name / "checkpoints")


# ------------------------------------------------- FAPO, CAPO and MRT ---


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
