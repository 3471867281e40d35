"""Every RL method config runs at `test` size; method-specific invariants."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import methods
from rl_rewards.runners import pipeline
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.runners.methods import base
from tests.core import advantages_test as core_advantages_test
from tests.core import core_reference as ref
from tests.core import prime_test as core_prime_test
from tests.core import pure_test as core_pure_test
from tests.core import thoughts_test as core_thoughts_test
from tests.runners import advantage_spy
from tests.runners import igpo_test
from tests.runners import spa_rl_test

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
            ("capo", "source=oracle,critiques=3,voting=intersection"),
            *(pytest.param(*c, marks=pytest.mark.slow) for c in (
                ("fapo", "source=oracle"), ("capo", ""),
                ("capo", "critiques=5,voting=average"),
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
  if cfg.capo.critiques == 1:
    wrong = _flagged_steps(batch["step_scores"], ids,
                           cfg.capo.threshold).astype(float)
  else:  # Sampled critiques, C votes per step.
    flags = batch["critique_flags"]
    assert flags.shape[1] == cfg.capo.critiques
    votes, count = flags.sum(axis=1), flags.shape[1]
    wrong = {"majority": 2 * votes > count, "intersection": votes == count,
             "average": votes / count}[cfg.capo.voting].astype(float)
  return (cfg.capo.w_whole * _outcome_ref(cfg, batch) -
          cfg.capo.w_process * _on_steps(wrong, ids, mask))


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
    "gra": _gra_ref, "igpo": igpo_test.loop_reference,
    "spa_rl": spa_rl_test.reference_advantages,
}


def test_every_method_has_a_reference():
  assert sorted(_REFERENCES) == sorted(methods.METHODS)


@pytest.mark.parametrize("name,arg", CONFIGS)
def test_config_runs_two_rl_steps(name, arg, sft_dir, tmp_path,
                                  mixed_outcomes, monkeypatch):
  del mixed_outcomes
  config = _config(name, sft_dir, arg)
  config.rl.filter_accuracy = False  # Keep every mixed group.
  seen = advantage_spy.spy_on_advantages(monkeypatch, config.rl.method)
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
