"""The PRM stages through the pipeline at `test` size: sft -> labels -> prm
-> prm_eval in a workdir, reuse of finished stages, resume of the labels.

A `test`-size policy after a few SFT steps solves nothing, so first-error F1
would be undefined (no correct solutions). The stages' samplers are replaced
by a scripted policy that writes each step right with probability 0.75 and
never recovers from a mistake: the label set and the evaluated solutions
then mix correct and faulty solutions, and Q-hat is known to be 0 after a
solution's first error. Everything else (SFT, label store, PRM training, the
scorers and metrics) runs as in a real run.
"""

import json
import os
import shutil

import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import metrics as metrics_lib
from rl_rewards.prm import label_store
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages

from . import fakes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
P_CORRECT = 0.75


def _config():
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "prm.py") +
      ":size=test,model=head,target=soft")
  config.stages = "sft,labels,prm,prm_eval"
  return config


class _Samplers:
  """Replaces `prm_stages.policy_sampler`; counts the samplers built."""

  def __init__(self):
    self.built = 0

  def __call__(self, ctx, params, *, temperature, max_new_tokens=0):
    del params, temperature
    self.built += 1
    return fakes.ScriptedPolicy(
        ctx.task.tokenizer, p_correct=P_CORRECT,
        max_new_tokens=max_new_tokens or ctx.task.max_new_tokens)


def _run(workdir):
  samplers = _Samplers()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(prm_stages, "policy_sampler", samplers)
    summary = pipeline.run(_config(), workdir)
  return summary, samplers.built


def _shards(workdir):
  """{name: (bytes, mtime_ns)} of the label directory's files."""
  directory = prm_stages.label_dir(workdir)
  out = {}
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    with open(path, "rb") as f:
      out[name] = (f.read(), os.stat(path).st_mtime_ns)
  return out


def _dump(stages):
  return json.dumps(stages, sort_keys=True)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("prm_run"))
  summary, built = _run(workdir)
  assert built == 3  # Labels: policy and prover; prm_eval: the policy.
  return workdir, summary, _shards(workdir)


def test_label_set_on_disk(first_run):
  workdir, summary, files = first_run
  assert sorted(files) == ["manifest.json", "shard-00000.jsonl",
                           "shard-00001.jsonl"]
  manifest, records = label_store.read_label_set(
      prm_stages.label_dir(workdir))
  # 8 problems x 2 samples in shards of 4 problems; m = 2 rollouts.
  assert manifest["num_shards"] == 2 and manifest["num_solutions"] == 16
  assert manifest["num_rollouts"] == 2 and len(records) == 16
  assert summary["stages"]["labels"]["labels/solutions"] == 16
  assert 0 < np.mean([r["outcome"] for r in records]) < 1
  positive = 0
  for r in records:
    k = len(r["hard"])
    assert r["q"][-1] == r["outcome"] and r["hard"][-1] == r["outcome"]
    for j in range(k - 1):
      assert r["q"][j] in (0.0, 0.5, 1.0)       # c / m with m = 2.
      assert r["hard"][j] == float(r["q"][j] > 0)
      if 0 <= r["first_error"] <= j:
        assert r["q"][j] == 0.0                 # No recovery from an error.
      positive += r["q"][j] > 0
    assert r["oracle"] is not None and len(r["oracle"]) == k
  assert positive > 0


def test_summary_has_f1_of_every_scorer(first_run):
  workdir, summary, _ = first_run
  on_disk = metrics_lib.read_json(os.path.join(workdir, "summary.json"))
  assert set(on_disk["stages"]) == {"sft", "labels", "prm", "prm_eval"}
  assert _dump(on_disk["stages"]) == _dump(
      json.loads(json.dumps(summary["stages"])))
  evaluation = on_disk["stages"]["prm_eval"]
  assert 0 < evaluation["prm_eval/erroneous_fraction"] < 1
  assert evaluation["prm_eval/f1_oracle"] == 1.0
  assert evaluation["prm_eval/acc_err_oracle"] == 1.0
  assert evaluation["prm_eval/acc_cor_oracle"] == 1.0
  assert evaluation["prm_eval/auroc_oracle"] == 1.0
  # Each scorer's numbers, from the logged ones: accuracies are exact-match
  # counts over the erroneous and the correct test solutions, and F1 their
  # harmonic mean (ProcessBench).
  num = _config().prm_eval.num_problems
  num_err = evaluation["prm_eval/erroneous_fraction"] * num
  assert num_err == round(num_err)
  counts = {"acc_err": round(num_err), "acc_cor": num - round(num_err)}
  for suffix in ("", "_random", "_oracle"):
    acc = {}
    for name, count in counts.items():
      acc[name] = evaluation[f"prm_eval/{name}{suffix}"]
      assert acc[name] * count == pytest.approx(round(acc[name] * count),
                                                abs=1e-9), (name, suffix)
    total = acc["acc_err"] + acc["acc_cor"]
    f1 = 2 * acc["acc_err"] * acc["acc_cor"] / total if total else 0.0
    assert evaluation[f"prm_eval/f1{suffix}"] == pytest.approx(
        f1, abs=1e-12), suffix
  # The random scorer is not the oracle.
  assert evaluation["prm_eval/f1_random"] < 1.0
  assert summary["stages"]["prm"]["prm/steps"] == 4
  assert summary["stages"]["prm"]["prm/model"] == "head"
  # Best-of-N with the oracle's min picks an all-correct solution whenever
  # there is one: it reaches pass@N.
  for n in (1, 4, 16):
    assert f"prm_eval/bon{n}_last" in evaluation
    assert evaluation[f"prm_eval/bon{n}_oracle_min"] == (
        evaluation[f"prm_eval/pass{n}"])


def test_rerun_reuses_every_stage(first_run):
  workdir, summary, files = first_run
  metrics_before = metrics_lib.read_metrics(workdir)
  again, built = _run(workdir)
  assert built == 0  # Nothing sampled: labels and evaluation reused.
  assert _shards(workdir) == files  # No shard rewritten.
  assert _dump(again["stages"]) == _dump(
      json.loads(json.dumps(summary["stages"])))
  assert metrics_lib.read_metrics(workdir) == metrics_before


def test_labels_resume_after_the_last_shard_is_lost(first_run, tmp_path):
  workdir, _, files = first_run
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  before = _shards(copy)
  os.remove(os.path.join(prm_stages.label_dir(copy), "shard-00001.jsonl"))
  os.remove(os.path.join(copy, "checkpoints", "labels", "stage_done.json"))
  _, built = _run(copy)
  assert built == 2  # The labels stage ran again, prm_eval was reused.
  after = _shards(copy)
  assert sorted(after) == sorted(files)
  # Shard 0 was kept as it was; shard 1 was recomputed bit for bit.
  assert after["shard-00000.jsonl"] == before["shard-00000.jsonl"]
  assert after["shard-00001.jsonl"][0] == files["shard-00001.jsonl"][0]
  assert after["shard-00001.jsonl"][1] != before["shard-00001.jsonl"][1]
  assert os.path.exists(os.path.join(copy, "checkpoints", "labels",
                                     "stage_done.json"))


def test_label_statistics_against_the_step_checker_by_hand():
  def record(q, hard, oracle, first_error, outcome):
    return dict(q=q, hard=hard, oracle=oracle, first_error=first_error,
                outcome=outcome, v=0.5)

  records = [
      # Q-hat ranks the correct steps above the wrong ones...
      record([0.9, 0.2], [1.0, 0.0], [True, False], 1, False),
      # ... except here: a correct step at 0.1, below the wrong step's 0.2,
      # and an unlabelled prefix (None) that does not count.
      record([0.1, None, 0.6], [0.0, 1.0, 1.0], [True, True, True], -1, True),
  ]
  stats = prm_stages.label_statistics(records)
  # Positives (correct steps) 0.9, 0.1, 0.6; negative 0.2: 2 of 3 pairs.
  assert stats["labels/q_auroc_vs_oracle"] == pytest.approx(2 / 3)
  # hard vs oracle per step: agree, agree, disagree, agree, agree.
  assert stats["labels/hard_vs_oracle"] == pytest.approx(4 / 5)
  # First hard-0 step: 1 (matches), 0 (the oracle says no error).
  assert stats["labels/first_error_vs_oracle"] == pytest.approx(1 / 2)
  assert stats["labels/steps"] == 5
