"""SPA-RL (runners/methods/spa_rl.py): advantages by hand, the progress
estimator's update, and a run of configs/spa_rl.py that resumes."""

import os

import jax
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import methods
from rl_rewards.runners import pipeline
from rl_rewards.runners import plan
from rl_rewards.runners.methods import spa_rl
from rl_rewards.sharding import mesh as mesh_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# Two episodes of one group, P = 1 prompt slot. Row 0: three turns with an
# observation (−1) after turn 0 and between turns 1 and 2; row 1: two turns.
STEP_IDS = np.array([[-1, 0, 0, -1, 1, -1, 2, 2],
                     [-1, 0, -1, -1, 1, 1, -1, -1]], np.int32)


def reference_advantages(cfg, config, batch):
  """SPA-RL by loops, from the batch: r_k = α·ĉ_k + β·g_k, G_k = η·R +
  Σ_{j≥k} r_j, minus the group mean (drgrpo) or the mean of the others
  (rloo) of G_0, on every policy token of turn k."""
  del config
  own, n = cfg.spa_rl, cfg.group_size
  ids, mask = batch["step_ids"], batch["response_mask"]
  c, g = batch["spa_contributions"], batch["spa_grounding"]
  r = batch["rewards"].astype(np.float64)
  returns = np.zeros(c.shape)
  for b in range(len(r)):
    last = int(ids[b].max())
    for k in range(last + 1):
      returns[b, k] = own.outcome_coef * r[b] + sum(
          own.contribution_coef * c[b, j] + own.grounding_coef * g[b, j]
          for j in range(k, last + 1))
  episode = returns[:, 0].reshape(-1, n)
  if cfg.advantage_estimator == "rloo" and n > 1:
    baseline = (episode.sum(axis=1, keepdims=True) - episode) / (n - 1)
  else:
    baseline = np.repeat(episode.mean(axis=1, keepdims=True), n, axis=1)
  baseline = baseline.reshape(-1)
  out = np.zeros(ids.shape)
  for b in range(len(r)):
    for t in range(ids.shape[1]):
      if ids[b, t] >= 0:
        out[b, t] = (returns[b, ids[b, t]] - baseline[b]) * mask[b, t]
  return out


def _method(**own):
  config = config_lib.base_config()
  config.task.name = "hidden_operands"
  config.rl.method = "spa_rl"
  config.rl.advantage_estimator = own.pop("estimator", "drgrpo")
  config.rl.group_size = 2
  for key, value in own.items():
    config.rl.spa_rl[key] = value
  method = methods.make(config)
  method.check()
  return config, method


def _batch(**extra):
  return {"rewards": np.array([1.0, 0.0], np.float32),
          "spa_contributions": np.array([[0.2, 0.3, 0.4], [0.5, -0.1, 9.0]],
                                        np.float32),
          "spa_grounding": np.array([[1, 0, 1], [0, 1, 1]], np.float32),
          "step_ids": STEP_IDS,
          "response_mask": (STEP_IDS >= 0).astype(np.float32), **extra}


def test_advantages_by_hand():
  # r = ĉ + 0.5·g: [0.7, 0.3, 0.9] and [0.5, 0.4] (row 1's third slot is
  # padding); returns-to-go [1.9, 1.2, 0.9] and [0.9, 0.4]; baseline 1.4.
  config, method = _method(grounding_coef=0.5)
  a, parts = method.advantages(_batch())
  want = np.array([[0, .5, .5, 0, -.2, 0, -.5, -.5],
                   [0, -.5, 0, 0, -1, -1, 0, 0]])
  np.testing.assert_allclose(a, want, atol=1e-6)
  np.testing.assert_allclose(a, reference_advantages(config.rl, config,
                                                     _batch()), atol=1e-6)
  # The outcome part is Dr. GRPO's R − mean(R) = ±0.5 on policy tokens.
  np.testing.assert_allclose(parts["outcome"],
                             0.5 * np.array([[1], [-1]]) * (STEP_IDS >= 0))
  np.testing.assert_allclose(parts["process"], a - parts["outcome"],
                             atol=1e-6)
  # The oracle's turn labels (diagnostics only) do not change them.
  labels = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
  a2, _ = method.advantages(_batch(step_scores=labels))
  np.testing.assert_array_equal(np.asarray(a2), np.asarray(a))


def test_rloo_and_outcome_term_by_hand():
  # η = 1, β = 0: G = R + Σ_{j≥k} ĉ_j = [1.9, 1.7, 1.4] and [0.4, −0.1];
  # rloo baselines: the other's return, 0.4 and 1.9.
  config, method = _method(grounding_coef=0.0, outcome_coef=1.0,
                           estimator="rloo")
  a, _ = method.advantages(_batch())
  want = np.array([[0, 1.5, 1.5, 0, 1.3, 0, 1.0, 1.0],
                   [0, -1.5, 0, 0, -2.0, -2.0, 0, 0]])
  np.testing.assert_allclose(a, want, atol=1e-6)
  np.testing.assert_allclose(a, reference_advantages(config.rl, config,
                                                     _batch()), atol=1e-6)


def test_config_checks():
  with pytest.raises(config_lib.ConfigError, match="advantage_estimator"):
    _method(estimator="grpo")
  config = config_lib.base_config()
  config.rl.method = "spa_rl"
  config.rl.advantage_estimator = "drgrpo"
  with pytest.raises(config_lib.ConfigError, match="grounding_coef"):
    methods.make(config).check()  # The arith task has no environment.
  config.rl.spa_rl.grounding_coef = 0.0
  methods.make(config).check()
  config.rl.spa_rl.learning_rate = 0.0
  with pytest.raises(config_lib.ConfigError, match="spa_rl.learning_rate"):
    config_lib.validate(config)


def test_grounding_is_zero_after_an_unknown_action_answer():
  q = 7  # The token id of "?".
  # Row 0: turn 0 answered "?" (not grounded), turn 1 answered "x"
  # (grounded), turn 2 is the last turn and followed by "?": grounded by
  # convention. Row 1: turn 0 followed directly by turn 1 (no observation).
  ids = np.array([[-1, 0, -1, -1, 1, -1, 2, -1],
                  [-1, 0, 1, 1, -1, -1, -1, -1]], np.int32)
  tokens = np.array([[1, 2, q, 3, 4, 5, 6, q],
                     [1, 2, q, 4, q, 0, 0, 0]], np.int32)
  g = spa_rl.grounding(tokens, ids, q, 3)
  np.testing.assert_array_equal(g, [[0, 1, 1], [1, 1, 1]])


# ------------------------------------------------------ the estimator ---


def _config(arg=""):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "spa_rl.py") + ":size=test" +
      (f",{arg}" if arg else ""))
  config.stages = "rl"
  config.eval.size_per_k = 4  # 8 held-out problems, one row per device.
  config.eval.batch_size = 8
  config.eval.pass_n = 1
  return config


def test_one_progress_update_reduces_the_sum_to_outcome_loss(tmp_path):
  config = _config()
  ctx = pipeline.build_context(config, str(tmp_path))
  params = pipeline.initial_params(ctx)
  method = methods.make(config)
  declared = {p.name: p for p in method.programs(ctx.model_config)}
  update = declared[spa_rl.UPDATE]
  state, shardings = context_lib.create_state(
      ctx.model_config, ctx.mesh, method.init_models(ctx, params)["progress"],
      update.tx, heads=update.heads)
  step = update.jit(shardings, ctx.mesh)
  scores = declared[spa_rl.SCORES].fn
  # A fixed batch of 8 rows: turns of 3 tokens with one observation token
  # between them, 1 to 4 turns a row, outcomes 0 or 1.
  rng = np.random.default_rng(0)
  b, t, s = 8, 20, config.task.max_steps
  ids = np.full((b, t), -1, np.int32)
  for row in range(b):
    for k in range(1 + row % 4):
      ids[row, 2 + 4 * k: 5 + 4 * k] = k
  batch = {"tokens": rng.integers(1, ctx.model_config.vocab_size, (b, t),
                                  dtype=np.int32),
           "attention_mask": np.ones((b, t), np.int32),
           "response_mask": (ids >= 0).astype(np.float32), "step_ids": ids,
           "rewards": np.array([1, 0] * 4, np.float32)}

  def loss(model):
    c = core.spa.turn_end_values(
        scores(model.params, batch["tokens"], batch["attention_mask"]),
        ids, s)
    return float(core.spa.progress_loss(c, core.step_mask_from_ids(ids, s),
                                        batch["rewards"]))

  before = loss(state)
  start = jax.device_get(state.params)  # The update donates the state.
  state, metrics = step(state, jax.device_put(batch))
  assert float(metrics["spa_loss"]) == pytest.approx(before, rel=1e-4)
  assert int(state.step) == 1 and int(state.skipped) == 0
  assert loss(state) < before
  # Micro-batches of 4 rows (|P| counted on the whole batch) give the same
  # update.
  config.rl.micro_batch_size = 4
  micro = {p.name: p for p in methods.make(config).programs(
      ctx.model_config)}[spa_rl.UPDATE]
  fresh, _ = context_lib.create_state(ctx.model_config, ctx.mesh, start,
                                      micro.tx, heads=micro.heads)
  fresh, micro_metrics = micro.jit(shardings, ctx.mesh)(
      fresh, jax.device_put(batch))
  assert float(micro_metrics["spa_loss"]) == pytest.approx(before, rel=1e-4)
  for x, y in zip(jax.tree.leaves(fresh.params),
                  jax.tree.leaves(state.params)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_the_planner_compiles_the_estimator_programs():
  config = _config()
  model_config, mesh, rules = pipeline.plan_context(config)
  with mesh_lib.activate(mesh, rules):
    builders = plan.pipeline_programs(config, model_config, mesh)
    mine = [b for b in builders if b.name in (spa_rl.SCORES, spa_rl.UPDATE)]
    assert len(mine) == 2
    reports = plan.plan(mine)
  assert [r.name for r in reports] == [spa_rl.SCORES, spa_rl.UPDATE]


def _saved(workdir):
  """{path: host array} of the RL stage's latest checkpoint."""
  ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints", "rl"))
  restored = ckpt.restore_raw()
  ckpt.close()
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_leaves_with_path(restored)}


def _records(workdir):
  """The RL steps' training and rollout records (no timings)."""
  return [{k: v for k, v in r.items()
           if k == "step" or k.startswith(("train/", "rollout/"))}
          for r in metrics_lib.read_metrics(workdir)
          if r["stage"] == "rl" and "train/loss" in r]


def _run(workdir, steps):
  config = _config()
  config.rl.steps = steps
  config.rl.checkpoint_every_steps = 1
  return pipeline.run(config, workdir)


def test_run_logs_its_metrics_and_checkpoints_the_progress_model(tmp_path):
  # configs/spa_rl.py at test size from a random policy (the loop's path is
  # the same with an SFT policy), two RL steps.
  workdir = str(tmp_path / "run")
  summary = _run(workdir, 2)
  assert summary["stages"]["rl"]["rl/steps"] == 2
  records = _records(workdir)
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    for key in ("loss", "loss_after", "grad_norm", "contribution_mean",
                "sum_abs_error", "grounded_fraction", "oracle_corr"):
      assert np.isfinite(r[f"train/spa_rl/{key}"]), key
    assert 0 <= r["train/spa_rl/grounded_fraction"] <= 1
    assert r["train/progress_skipped_updates"] == 0
  # The estimator is checkpointed with the policy: parameters, optimizer
  # state and its step counter (one update per RL step).
  saved = _saved(workdir)
  assert any(k.startswith("['progress']['params']") for k in saved)
  assert any(k.startswith("['progress']['opt_state']") for k in saved)
  assert int(saved["['progress']['step']"]) == 2


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
  reference, resumed = str(tmp_path / "reference"), str(tmp_path / "resumed")
  _run(reference, 2)
  _run(resumed, 1)
  first = _saved(resumed)
  _run(resumed, 2)  # Resumes from the step-1 checkpoint.
  assert _records(resumed) == _records(reference)
  want, got = _saved(reference), _saved(resumed)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  # The resumed step trained the restored estimator further.
  progress = [k for k in want if k.startswith("['progress']['params']")]
  assert any(not np.array_equal(first[k], want[k]) for k in progress)


def test_oracle_correlation_by_hand():
  x = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 0, 0]], bool)
  # Over the four valid turns: x = [1, 2, 3, 4] against y = [0, 0, 1, 1]:
  # centred [-1.5, -.5, .5, 1.5] · [-.5, -.5, .5, .5] = 2 over
  # sqrt(5 · 1): 2/√5. The padded turns (0 and 9) count nowhere.
  y = np.array([[0, 0, 1], [1, 9, 9]], np.float32)
  np.testing.assert_allclose(spa_rl._correlation(x, y, mask), 2 / np.sqrt(5),
                             rtol=1e-6)
  np.testing.assert_allclose(spa_rl._correlation(x, -y, mask),
                             -2 / np.sqrt(5), rtol=1e-6)
  assert float(spa_rl._correlation(x, np.ones_like(y), mask)) == 0.0
