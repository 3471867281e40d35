"""A trained turn verifier on the multi-turn task (configs/multiturn.py with
`source=model`): its configs and their checks, the verifier's per-turn
scores on an episode batch, and (under `-m slow`) the whole pipeline sft ->
labels -> prm -> rl at test size."""

import json
import math
import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import metrics as metrics_lib
from rl_rewards import models
from rl_rewards.prm import label_store
from rl_rewards.prm import scoring
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages
from rl_rewards.runners import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _config(arg):
  return cli.load_config_file(
      os.path.join(ROOT, "configs", "multiturn.py") + ":" + arg)


@pytest.mark.parametrize("method,model,target,value_weight", [
    ("pav", "head", "soft", 1.0), ("pure", "generative", "progress", 0.0)])
def test_source_model_trains_a_turn_verifier(method, model, target,
                                             value_weight, tmp_path):
  config = _config(f"method={method},source=model,size=test")
  assert config.stages == "sft,labels,prm,rl"
  assert config.task.name == "hidden_operands"
  assert config.rl.prm_source == "model"
  assert config.rl.method == method
  assert (config.prm.model, config.prm.target) == (model, target)
  assert config.prm.value_weight == value_weight
  assert config.labels.num_problems == 8  # The test size's budgets.
  config_lib.validate(config)
  pipeline.check_stages(config, str(tmp_path))
  # The default (tiny) size trims the labels stage for ~10 turns an episode.
  tiny = _config(f"method={method},source=model")
  assert tiny.labels.num_rollouts == 4 and tiny.labels.num_problems == 64
  config_lib.validate(tiny)
  # A finished run's pieces are reused by path.
  reused = _config(f"method={method},source=model,prm=/runs/a,size=test")
  assert reused.stages == "sft,rl" and reused.prm.init_from == "/runs/a"
  # source=oracle stays the task's own turn labels.
  oracle = _config(f"method={method},size=test")
  assert oracle.stages == "sft,rl" and oracle.rl.prm_source == "oracle"


@pytest.mark.parametrize("arg,match", [
    ("source=bogus", "source"),
    ("method=grpo,source=model", "source"),
    ("method=oracle,source=model", "source"),
    ("method=pav,prm=/runs/a", "labels/prm"),
])
def test_bad_arguments_name_the_argument(arg, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    _config(arg + ",size=test")


@pytest.mark.parametrize("key,value,match", [
    ("labels.method", "binary_search", "config.labels.method"),
    ("prm.model", "implicit", "config.prm.model"),
    ("stages", "sft,labels,prm,prm_eval,rl", "config.stages"),
])
def test_unsupported_stage_settings_fail_before_any_stage(key, value, match,
                                                          tmp_path):
  config = _config("method=pav,source=model,size=test")
  section, _, name = key.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(config)
    pipeline.check_stages(config, str(tmp_path))


def test_single_turn_labels_are_refused_for_episodes(tmp_path):
  labels_dir = tmp_path / "labels"
  labels_dir.mkdir()
  (labels_dir / label_store.MANIFEST).write_text(json.dumps(
      {"num_shards": 1, "num_solutions": 8, "samples_per_problem": 2,
       "complete": True}))
  config = _config("method=pav,source=model,size=test")
  config.labels.init_from = str(tmp_path)
  config.stages = "sft,prm,rl"
  with pytest.raises(config_lib.ConfigError,
                     match="labels.init_from.*single-turn"):
    prm_stages.check_config(config, str(tmp_path / "run"))


def test_verifier_scores_each_turn_at_its_end(tmp_path):
  """The RL stage's call (`score_rollout` on the episode batch, turn ids as
  step ids): turn k's score is σ(score head) at turn k's last token, V at
  the prompt's last token; observation tokens are never read."""
  config = _config("method=pav,source=model,size=test")
  task = tasks.make_task(config.task, seed=0)
  cfg = models.preset("test", task.tokenizer.vocab_size)
  policy = models.init_params(cfg, jax.random.key(0))
  head = models.init_from_backbone(cfg, policy, jax.random.key(1),
                                   heads=("score",))
  out = task.sample_episodes(cfg, policy, task.problems("train", 0, 4),
                             jax.random.key(1), temperature=0.0)
  assert out.observation_mask.sum() > 0
  scorer = scoring.head_scorer(cfg, head, config.task.max_steps)
  scores = jax.device_get(scorer.score_rollout(
      out.tokens, out.attention_mask, out.turn_ids))
  logits = np.asarray(scoring.head_logits(cfg, head, out.tokens,
                                          out.attention_mask))
  prompt_len = task.max_prompt_len
  for row in range(4):
    turns = out.turn_ids[row]
    for k in range(out.num_turns[row]):
      end = np.nonzero(turns == k)[0][-1]
      np.testing.assert_allclose(scores["step_scores"][row, k],
                                 jax.nn.sigmoid(logits[row, end]), rtol=1e-5)
    assert not scores["step_scores"][row, out.num_turns[row]:].any()
    np.testing.assert_allclose(scores["v_init"][row],
                               jax.nn.sigmoid(logits[row, prompt_len - 1]),
                               rtol=1e-5)


@pytest.mark.slow  # ~3 min on 2 cores: every stage compiles.
def test_pav_with_a_trained_turn_verifier_runs_every_stage(tmp_path):
  workdir = str(tmp_path / "run")
  config = _config("method=pav,source=model,size=test")
  summary = pipeline.run(config, workdir)
  assert list(summary["stages"]) == ["sft", "labels", "prm", "rl"]
  # The workdir: a checkpoint directory per stage, the label shards.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
      "labels", "prm", "rl", "sft"]
  for name in ("config.json", "metrics.jsonl", "summary.json",
               "labels/manifest.json", "labels/shard-00000.jsonl",
               "labels/shard-00001.jsonl"):
    assert os.path.exists(os.path.join(workdir, name)), name
  manifest, records = label_store.read_label_set(
      prm_stages.label_dir(workdir))
  assert manifest["turn_level"] is True
  assert len(records) == config.labels.num_problems * \
      config.labels.samples_per_problem
  for record in records:
    turns = max(record["turn_ids"]) + 1
    assert len(record["q"]) == turns == len(record["oracle"])
    assert record["q"][-1] == record["outcome"]
  assert summary["stages"]["prm"]["prm/model"] == "head"
  rl_records = [r for r in metrics_lib.read_metrics(workdir)
                if r["stage"] == "rl" and "train/loss" in r]
  assert len(rl_records) == config.rl.steps
  for record in rl_records:
    assert math.isfinite(record["train/loss"])
    assert 0.0 < record["prm/mean_step_score"] < 1.0
  assert math.isfinite(summary["stages"]["rl"]["eval/accuracy"])
