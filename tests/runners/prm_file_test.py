"""`configs/prm.py:data=file`: each PRM kind trained from a stepwise file on
a tiny random hub-format checkpoint with its chat template, then used by
RL (`prm.init_from`) and loaded as beam search loads it.

One module-scoped run per kind: head from TRL-layout JSON lines (held out:
a Parquet file), generative from Math-Shepherd rows in a JSON list (held
out: a fraction of them), implicit from a Parquet file (nothing held out).
"""

import os

import jax
import numpy as np
import pytest

from rl_rewards import checkpoints
from rl_rewards import cli
from rl_rewards import config_lib
from rl_rewards import models
from rl_rewards.prm import evaluation as prm_eval_lib
from rl_rewards.prm import scoring
from rl_rewards.prm import training
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_files
from rl_rewards.runners import prm_stages
from tests.prm import stepwise_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KINDS = ("head", "generative", "implicit")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("prm_file")
  rows = stepwise_files.trl_rows(12)
  return {
      "root": root,
      "checkpoint": stepwise_files.checkpoint(root / "checkpoint"),
      "task": stepwise_files.gsm8k_task_files(root / "task"),
      "head": (stepwise_files.write(root / "train.jsonl", rows[:8]),
               stepwise_files.write(root / "valid.parquet", rows[8:])),
      "generative": (stepwise_files.write(
          root / "shepherd.json",
          [stepwise_files.math_shepherd_row(r) for r in rows]), ""),
      "implicit": (stepwise_files.write(root / "train.parquet", rows), ""),
  }


def _prm_config(files, kind):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py") +
      f":data=file,size=test,model={kind}")
  config.model.hf_path = files["checkpoint"]
  config.task.train_path = files["task"]["train"]
  config.task.eval_path = files["task"]["eval"]
  config.prm.train_path, config.prm.valid_path = files[kind]
  if kind == "generative":
    config.prm.preset = "math_shepherd"
  if kind == "implicit":
    config.prm.valid_fraction = 0.0   # Every row trains.
  return config


@pytest.fixture(scope="module")
def runs(files):
  out = {}
  for kind in KINDS:
    workdir = str(files["root"] / f"prm_{kind}")
    out[kind] = (workdir, pipeline.run(_prm_config(files, kind), workdir))
  return out


def _leaves(params):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path(params)[0]}


def test_each_kind_trains_from_its_file(files, runs):
  _, hub = models.load_hf(files["checkpoint"])
  hub = _leaves(hub)
  rows = {"head": (8, 4), "generative": (9, 3), "implicit": (12, 0)}
  for kind in KINDS:
    workdir, summary = runs[kind]
    prm = summary["stages"]["prm"]
    assert prm["prm/model"] == kind and prm["prm/data"] == "file"
    assert (prm["prm/train_rows"], prm["prm/valid_rows"]) == rows[kind]
    assert prm["prm/steps"] == 2 and prm["prm/skipped_updates"] == 0
    # The files have no V-hat: RL must not read V(question) as trained.
    assert prm["prm/value_weight"] == 0.0
    assert np.isfinite(prm["train/prm_loss"])
    if kind != "implicit":
      assert 0.0 <= prm["prm/valid_auroc_vs_labels"] <= 1.0
    # Initialised from the checkpoint, then trained.
    state, _ = checkpoints.restore_finished(workdir, "prm", "prm.init_from")
    trained = _leaves(state["prm"]["params"])
    shared = [k for k in hub if k in trained]
    assert len(shared) >= len(hub) - 1   # The backbone (and the LM head).
    assert any(not np.array_equal(hub[k], trained[k]) for k in shared)


def test_search_loads_the_file_prm_and_the_checkpoint_policy(files, runs):
  """What experiments/search.py does with a data=file run: its policy is
  the checkpoint, and the loaded PRM scores the held-out rows as the
  training run did (the same step AUROC)."""
  workdir, summary = runs["head"]
  config = prm_stages.run_config(workdir)
  ctx = pipeline.build_context(config, str(files["root"] / "search"))
  try:
    policy, prm = prm_stages.run_policy_and_prm(ctx, workdir)
    _, hub = models.load_hf(files["checkpoint"])
    for a, b in zip(jax.tree.leaves(policy), jax.tree.leaves(hub)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    records = prm_files.file_label_records(ctx, "valid_path")
    arrays = training.label_arrays(
        records, prompt_width=ctx.task.max_prompt_len,
        response_budget=ctx.task.max_new_tokens,
        num_steps=config.task.max_steps,
        delimiter_mask=ctx.task.delimiter_mask(),
        eos_id=ctx.task.tokenizer.stop_ids, pad_id=ctx.task.tokenizer.pad_id)
    scores = prm_stages.load_scorer(ctx, prm).score_batch(
        scoring.SolutionBatch(
            tokens=arrays["tokens"], attention_mask=arrays["attention_mask"],
            step_ids=arrays["step_ids"], num_steps=config.task.max_steps))
  finally:
    ctx.writer.close()
  mask = arrays["target_mask"] & scores["step_mask"]
  assert mask.sum() == 10   # 2 + 3 + 2 + 3 labelled steps.
  auroc = prm_eval_lib.auroc(scores["step_scores"][mask],
                             arrays["targets"][mask] >= 0.5)
  assert auroc == pytest.approx(
      summary["stages"]["prm"]["prm/valid_auroc_vs_labels"], abs=1e-6)


def _rl_config(files, kind):
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = files["checkpoint"]
  config.model.dtype = "float32"
  config.model.remat = "none"            # Compiles faster; still scanned.
  config.task.train_path = files["task"]["train"]
  config.task.eval_path = files["task"]["eval"]
  config.task.prompt_template = "chat"   # The PRM's delimiter: "\n\n".
  config.stages = "rl"
  config.rl.steps = 1
  config.eval.pass_n = 1
  config.rl.method = "pure"
  config.rl.prm_source = "model"
  config.prm.init_from = str(files["root"] / f"prm_{kind}")
  return config


class _Spy:
  """Wraps `prm_stages.load_scorer`: records the step scores RL reads."""

  def __init__(self):
    self.kinds, self.scores = [], []
    self._load = prm_stages.load_scorer

  def __call__(self, ctx, prm):
    scorer = self._load(ctx, prm)
    self.kinds.append(prm.kind)
    spy = self

    class Scorer:

      def __getattr__(self, name):
        return getattr(scorer, name)

      def score_rollout(self, *args, **kwargs):
        out = scorer.score_rollout(*args, **kwargs)
        spy.scores.append(np.asarray(out["step_scores"]))
        return out

    return Scorer()


def test_rl_scores_rollouts_with_the_file_prm(files, runs, tmp_path):
  del runs
  spy = _Spy()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(prm_stages, "load_scorer", spy)
    summary = pipeline.run(_rl_config(files, "generative"),
                           str(tmp_path / "rl"))
  assert summary["stages"]["rl"]["rl/steps"] == 1
  # The RL run is scanned, the PRM was trained per layer: loaded all the
  # same, and its step probabilities reached the advantages.
  assert spy.kinds == ["generative"]
  assert spy.scores and all(((s >= 0) & (s <= 1)).all() for s in spy.scores)


def test_rl_with_other_step_boundaries_is_refused(files, runs, tmp_path):
  del runs
  config = _rl_config(files, "head")
  config.task.delimiter = "\n"
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.prm.init_from: the PRM of .*prm_head was "
                           r"trained on steps cut at '\\n\\n', but "
                           r"config.task.delimiter is '\\n'"):
    pipeline.run(config, str(tmp_path / "rl"))
