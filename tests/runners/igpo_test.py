"""IGPO (runners/methods/igpo.py): turn advantages by hand, and the loop."""

import math
import os
import re

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.runners import methods
from rl_rewards.runners import pipeline
from rl_rewards.runners import plan
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.runners.methods import igpo as igpo_method
from rl_rewards.sharding import mesh as mesh_lib
from tests.runners import advantage_spy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# One group of two episodes, P = 1 prompt slot, S = 3 turn slots. Row 0:
# three turns, an observation (−1) after turns 0 and 1; row 1: one turn
# (it answered at once), then padding.
STEP_IDS = np.array([[-1, 0, 0, -1, 1, -1, 2, 2],
                     [-1, 0, 0, -1, -1, -1, -1, -1]], np.int32)
# P(answer) after the prompt, before turn 1, before turn 2, at the end.
# Row 0's gains: 0.5 − 0.2 = 0.3, 0.4 − 0.5 = −0.1; row 1 has none.
P = np.array([[0.2, 0.5, 0.4, 0.9], [0.5, 0.7, 0.7, 0.7]])
REWARDS = np.array([1.0, 0.0], np.float32)


def loop_reference(cfg, config, batch):
  """IGPO by loops over groups, rows and turns (methods_test's reference).

  r = exp(m_{k+1}) − exp(m_k) before the last turn, the outcome on it;
  z-scored over the group's entries (population std under sqrt(var +
  1e-8), 1 for one entry; jointly or outcomes and gains apart); A_k =
  Σ_{j≥k} γ^{j−k} ẑ_j on turn k's tokens.
  """
  del config
  ids, mask = batch["step_ids"], batch["response_mask"]
  m = batch["answer_logprobs"].astype(np.float64)
  r = batch["rewards"].astype(np.float64)
  n, igpo = cfg.group_size, cfg.igpo
  b_rows = len(r)
  turns = [int(ids[b].max()) + 1 for b in range(b_rows)]
  rewards = {}
  for b in range(b_rows):
    for k in range(turns[b]):
      rewards[b, k] = (r[b] if k == turns[b] - 1 else
                       math.exp(m[b, k + 1]) - math.exp(m[b, k]))
  z = {}
  for g in range(b_rows // n):
    rows = range(g * n, (g + 1) * n)
    keys = [(b, k) for b in rows for k in range(turns[b])]
    sets = [keys] if igpo.norm == "joint" else [
        [(b, k) for b, k in keys if k == turns[b] - 1],
        [(b, k) for b, k in keys if k < turns[b] - 1]]
    for entries in sets:
      values = [rewards[e] for e in entries]
      if not values:
        continue
      mean = sum(values) / len(values)
      var = sum((v - mean) ** 2 for v in values) / len(values)
      std = 1.0 if len(values) <= 1 else math.sqrt(var + 1e-8)
      for e in entries:
        z[e] = (rewards[e] - mean) / (std + cfg.advantage_eps)
  out = np.zeros(ids.shape)
  for b in range(b_rows):
    for t in range(ids.shape[1]):
      k = int(ids[b, t])
      if k >= 0 and mask[b, t] > 0:
        out[b, t] = sum(igpo.gamma ** (j - k) * z[b, j]
                        for j in range(k, turns[b]))
  return out


def _advantages(norm, gamma):
  config = config_lib.base_config()
  config.task.name = "hidden_operands"
  config.task.max_steps = 3
  config.rl.method = "igpo"
  config.rl.group_size = 2
  config.rl.igpo.norm = norm
  config.rl.igpo.gamma = gamma
  method = methods.make(config)
  method.check()
  batch = {"rewards": REWARDS, "answer_logprobs": np.log(P),
           "step_ids": STEP_IDS,
           "response_mask": (STEP_IDS >= 0).astype(np.float32)}
  a, parts = jax.jit(method.advantages)(batch)
  return (config, batch, np.asarray(a),
          {k: np.asarray(v) for k, v in parts.items()})


def test_separate_normalisation_and_discount_by_hand():
  # Outcomes 1, 0 -> z = +1, −1; gains 0.3, −0.1 (mean 0.1, std 0.2) ->
  # +1, −1. γ = 0.5: row 0's turns get 1 − 0.5 + 0.25, −1 + 0.5, 1; row 1's
  # only turn −1.
  _, _, a, parts = _advantages("separate", 0.5)
  want = np.array([[0, .75, .75, 0, -.5, 0, 1, 1],
                   [0, -1, -1, 0, 0, 0, 0, 0]])
  np.testing.assert_allclose(a, want, atol=1e-4)
  # The outcome part is GRPO's z-score of the rewards (unbiased std):
  # ±0.5 / 0.7071.
  np.testing.assert_allclose(
      parts["outcome"],
      np.array([[1], [-1]]) * (STEP_IDS >= 0) * 0.5 / math.sqrt(0.5),
      atol=1e-4)
  np.testing.assert_allclose(parts["process"], a - parts["outcome"],
                             atol=1e-6)


def test_joint_normalisation_by_hand():
  # Entries 0.3, −0.1, 1 (row 0) and 0 (row 1): mean 0.3, population var
  # (0 + 0.16 + 0.49 + 0.09) / 4 = 0.185. γ = 1: the sums from each turn on.
  _, _, a, _ = _advantages("joint", 1.0)
  s = math.sqrt(0.185 + 1e-8) + 1e-6
  want = np.array([[0, .3 / s, .3 / s, 0, .3 / s, 0, .7 / s, .7 / s],
                   [0, -.3 / s, -.3 / s, 0, 0, 0, 0, 0]])
  np.testing.assert_allclose(a, want, atol=1e-5)


@pytest.mark.parametrize("norm,gamma", [("joint", 0.9), ("separate", 1.0)])
def test_the_loop_reference_agrees(norm, gamma):
  config, batch, a, _ = _advantages(norm, gamma)
  np.testing.assert_allclose(a, loop_reference(config.rl, config, batch),
                             atol=1e-5)


def test_the_probe_scores_the_boundaries_before_each_last_turn():
  # Row 0 reads boundaries 0, 1, 2; row 1 boundary 0: 4 pairs (a power of
  # two already); at most B·(S+1) = 8 with S = 3.
  assert igpo_method.probe_rows_needed(STEP_IDS, 16) == 4
  assert igpo_method.probe_rows_needed(STEP_IDS[:1], 16) == 4
  assert igpo_method.probe_rows_needed(STEP_IDS[1:], 16) == 1
  assert igpo_method.probe_rows_needed(np.tile(STEP_IDS, (3, 1)), 16) == 16
  assert igpo_method.probe_rows_needed(np.full((2, 4), -1), 1) == 2


def test_igpo_needs_a_task_with_answer_text():
  config = config_lib.base_config()
  config.rl.method = "igpo"
  config.task.name = "gsm8k"
  with pytest.raises(config_lib.ConfigError, match="config.task.name"):
    methods.make(config).check()
  config.task.name = "hidden_operands"
  config.rl.igpo.norm = "pooled"
  with pytest.raises(config_lib.ConfigError, match="config.rl.igpo.norm"):
    config_lib.validate(config)


@pytest.mark.slow  # ~25 s on 2 cores: the sampler's and the probe's compiles.
def test_igpo_config_runs_an_rl_step(tmp_path, monkeypatch):
  """configs/igpo.py:size=test as experiments.train runs it (the RL stage of
  a random policy, one step): the batch carries each row's true answer
  turn, and the advantages are the loop reference's."""
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "igpo.py") + ":size=test,gamma=0.9")
  config.stages = "rl"
  config.rl.steps = 1
  config.eval.size_per_k = 2
  config.eval.batch_size = 8  # Divides the test mesh's 8 devices.
  config.eval.pass_n = 1
  seen = advantage_spy.spy_on_advantages(monkeypatch, "igpo")
  summary = pipeline.run(config, str(tmp_path))
  assert summary["stages"]["rl"]["rl/steps"] == 1
  [record] = [r for r in metrics_lib.read_metrics(str(tmp_path))
              if r["stage"] == "rl" and "train/loss" in r]
  for key in ("train/loss", "train/igpo_answer_prob_initial",
              "train/igpo_gain_mean", "train/advantage_var_process"):
    assert math.isfinite(record[key]), key
  [(batch, got)] = seen
  ctx_task = pipeline.build_context(config, str(tmp_path / "t")).task
  for row in range(0, len(batch["rewards"]), config.rl.group_size):
    ids = batch["answer_tokens"][row][batch["answer_mask"][row] > 0]
    assert re.fullmatch(r"#[0-9]+\n", ctx_task.tokenizer.decode(ids))
  np.testing.assert_allclose(got, loop_reference(config.rl, config, batch),
                             rtol=1e-4, atol=1e-4)
  assert np.abs(got).max() > 0.1  # Dense turn credit even at reward 0.


class _Policy:
  params = None


def test_mrt_forced_j_is_the_answer_probability_after_each_step():
  # The probe's (mean, sum) after the prompt and each step; MRT reads
  # J = exp(sum), not exp(mean) (here mean = sum / 2). Row 0: three steps,
  # J(question) 0.25, J after steps 0, 1: 0.5, 0.2; its last step's J is
  # its reward 1. Row 1: two steps, J(question) 0.4, J after step 0: 0.6,
  # last step J = reward 0.
  config = config_lib.base_config()
  config.task.max_steps = 3
  config.rl.method = "mrt"
  config.rl.group_size = 2
  config.rl.advantage_estimator = "drgrpo"
  config.rl.mrt.alpha = 2.0
  config.rl.mrt.j = "forced"
  config_lib.validate(config)
  method = methods.make(config)
  method.check()
  assert method.reads_answers and not method.reads_step_scores
  assert [p.name for p in method.programs(None)] == ["rl/answer_logprobs"]
  total = np.log(np.array([[0.25, 0.5, 0.2, 0.9], [0.4, 0.6, 0.3, 0.3]]))
  fns = {"rl/answer_logprobs": lambda *args, num_rows: (total / 2, total)}
  step_ids = np.array([[-1, 0, 0, 1, 2, 2], [-1, 0, 1, 1, -1, -1]],
                      np.int32)
  batch = {"tokens": None, "attention_mask": None, "step_ids": step_ids,
           "answer_tokens": None, "answer_mask": None,
           "rewards": np.array([1.0, 0.0], np.float32),
           "response_mask": (step_ids >= 0).astype(np.float32)}
  _, extra, record = method.signals(None, fns, {"policy": _Policy()}, batch)
  np.testing.assert_allclose(extra["v_init"], [0.25, 0.4], atol=1e-6)
  np.testing.assert_allclose(extra["q_values"][0], [0.5, 0.2, 1.0],
                             atol=1e-6)
  np.testing.assert_allclose(extra["q_values"][1, :2], [0.6, 0.0], atol=1e-6)
  assert record["train/mrt_forced_j_initial"] == pytest.approx(0.325)
  # Progress (reference "previous"): row 0 0.25, −0.3, 0.8; row 1 0.2,
  # −0.6. Dr. GRPO's outcome ±0.5, α = 2.
  a, _ = method.advantages(dict(batch, **extra))
  np.testing.assert_allclose(np.asarray(a), [
      [0, 1.0, 1.0, -0.1, 2.1, 2.1], [0, -0.1, -1.7, -1.7, 0, 0]],
                             atol=1e-5)


def test_mrt_config_with_forced_j_needs_no_verifier():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "mrt.py") + ":size=test,j=forced")
  assert config.rl.mrt.j == "forced"
  assert config.stages == "sft,rl"
  methods.check_config(config)
  config.task.name = "gsm8k"
  with pytest.raises(config_lib.ConfigError, match="config.task.name"):
    methods.make(config).check()
  with pytest.raises(config_lib.ConfigError, match="j"):
    cli.load_config_file(
        os.path.join(ROOT, "configs", "mrt.py") + ":size=test,j=sampled")


@pytest.mark.slow  # ~10 s on 2 cores.
def test_the_memory_planner_compiles_the_answer_probe():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "igpo.py") + ":size=test")
  model_config = models.preset("test", 24)
  mesh = mesh_lib.make_mesh(dict(data=2, fsdp=4, tensor=1))
  with mesh_lib.activate(mesh):
    builder = {b.name: b for b in plan.pipeline_programs(
        config, model_config, mesh)}["rl/answer_logprobs"]
    program = builder.build(builder.rows)
    # Params, tokens, attention mask, step ids, answer tokens and mask.
    width = tasks_lib.answer_width(config.task)
    assert [a.shape for a in program.args[1:]] == [
        (builder.rows, program.length)] * 3 + [(builder.rows, width)] * 2
    report = plan.measure(program)
  assert report.params > 0 and report.activations > 0


@pytest.mark.parametrize("task_name", ["arith", "hidden_operands"])
def test_answer_tokens_are_the_answer_line_as_the_policy_writes_it(
    task_name):
  config = config_lib.base_config()
  config.task.name = task_name
  task = tasks_lib.make_task(config.task, 0)
  problems = task.problems("train", 0, 4)
  tokens, mask = task.answer_tokens(problems)
  assert tokens.shape == mask.shape == (4, tasks_lib.answer_width(
      config.task))
  for row, problem in enumerate(problems):
    ids = [int(i) for i in tokens[row][mask[row] > 0]]
    answer = problem.chain.answer if task_name != "arith" else problem.answer
    if task_name == "arith":  # The last line of the solution, then EOS.
      assert ids[-1] == task.tokenizer.eos_id
      assert task.tokenizer.decode(ids[:-1]) == task.references(
          [problem])[0].split("\n")[-1]
    else:  # The last turn of the optimal episode.
      assert task.tokenizer.decode(ids) == task.references(
          [problem])[0].split("\n")[-2] + "\n"
    assert task.tokenizer.decode(ids).startswith(f"#{answer:03d}")
