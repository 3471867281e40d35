"""Best-of-N on a GSM8K-layout file and ProcessBench rows with a tiny random
hub-format checkpoint (Qwen2 layout, its chat template, a word-level
tokenizer.json; `tests/runners/gsm8k_files.py`).

Hand-computed Best-of-N: a scripted sampler writes four solutions per
problem (wrong "#### 7", right "#### 5", wrong "#### 7", and a right one
cut at the budget) and a scripted verifier prefers the right one, so
majority vote is wrong, the PRM's pick and its weighted vote are right, and
pass@N counts only finished right answers (math-verify against the file's
"#### 5"). The real policy and PRM then run the same path end to end.
"""

import json
import os

import jax
import numpy as np
import pytest

from rl_rewards import cli
from rl_rewards import config_data
from rl_rewards import errors
from rl_rewards import models
from rl_rewards.models import hf as hf_lib
from rl_rewards.prm import processbench
from rl_rewards.runners import context as context_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_eval
from rl_rewards.runners import prm_stages
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import verifiers
from tests.runners import gsm8k_files
from tests.tasks import chat_templates

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
# (2, 3) and (4, 1): two problems whose answer is 5.
BON_ROWS = [gsm8k_files.ROWS[0], gsm8k_files.ROWS[1]]
TEXTS = ["He has 7 apples . #### 7", "He has 5 apples . #### 5",
         "He has 7 apples . #### 7", "He has 5 apples . #### 5"]
CUT = 3  # The fourth solution is cut at the budget (no end-of-turn).


def _jsonl(path, rows):
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
  root = tmp_path_factory.mktemp("hub")
  checkpoint = root / "qwen2"
  checkpoint.mkdir()
  tokenizer = gsm8k_files.word_level_tokenizer(
      SPECIALS, "0123456789 +-=#\n system user assistant Be brief .")
  tokenizer.save(str(checkpoint / "tokenizer.json"))
  (checkpoint / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": None, "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>", "chat_template": chat_templates.QWEN25}))
  model_config = hf_lib.config_from_hf(dict(
      model_type="qwen2", hidden_size=32, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=48, num_hidden_layers=2,
      max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
      tie_word_embeddings=True, vocab_size=tokenizer.get_vocab_size()))
  models.save_hf(str(checkpoint), model_config,
                 models.init_params(model_config, jax.random.key(0)))
  config = cli.load_config_file(
      os.path.join(ROOT, "configs", "qwen_gsm8k.py") + ":smoke")
  config.model.hf_path = str(checkpoint)
  config.model.dtype = "float32"
  config.task.train_path = _jsonl(root / "train.jsonl", gsm8k_files.ROWS)
  config.task.eval_path = _jsonl(root / "test.jsonl", gsm8k_files.ROWS)
  config.task.prompt_template = "chat"
  config.task.system_prompt = "Be brief."
  config.prm_eval.prompts_per_batch = 4
  context = pipeline.build_context(config, str(root / "run"))
  yield context
  context.writer.close()


class _ScriptedSampler:
  """Writes TEXTS[s] as the s-th sample of every prompt."""

  def __init__(self, task):
    self.task = task

  def sample(self, tokens, mask, rng, *, num_samples=1, **kwargs):
    del mask, rng, kwargs
    tokenizer = self.task.tokenizer
    rows, width = tokens.shape
    budget = self.task.max_new_tokens
    out = np.full((rows * num_samples, width + budget), tokenizer.pad_id,
                  np.int32)
    response = np.zeros(out.shape, np.int32)
    truncated = np.zeros((rows * num_samples,), bool)
    for r in range(rows):
      for s in range(num_samples):
        i = r * num_samples + s
        ids = tokenizer.encode(TEXTS[s])
        if s == CUT:
          ids, truncated[i] = ids[:4], True   # "He has 5 apples"
        else:
          ids = ids + [tokenizer.end_of_turn_id]
        out[i, :width] = tokens[r]
        out[i, width:width + len(ids)] = ids
        response[i, width:width + len(ids)] = 1
    step_ids = np.asarray(segmentation.step_ids_from_tokens(
        out, response, self.task.delimiter_mask(),
        eos_id=tokenizer.stop_ids))
    return {"tokens": out, "response_mask": response, "step_ids": step_ids,
            "lengths": response.sum(1), "truncated": truncated,
            "stopped": np.zeros_like(truncated)}


class _PrefersFives:
  """A verifier scoring 0.9 every step of a response that says "#### 5"."""

  def score_batch(self, batch):
    step_ids = np.asarray(batch.step_ids)
    mask = np.arange(batch.num_steps)[None, :] < (
        step_ids.max(axis=1) + 1)[:, None]
    value = np.array([0.9 if "#### 5" in t else 0.2 for t in batch.texts])
    return {"step_scores": np.where(mask, value[:, None], 0.0),
            "step_mask": mask, "v_init": np.ones(len(value))}


def _prm(ctx):
  params = models.init_from_backbone(
      ctx.model_config, jax.device_get(pipeline.initial_params(ctx)),
      jax.random.key(1), heads=("score",))
  return prm_stages.TrainedPRM(
      "head", context_lib.place_params(ctx, params, ("score",)))


def test_best_of_n_hand_computed(ctx, tmp_path):
  path = _jsonl(tmp_path / "gsm8k_test.jsonl", BON_ROWS)
  kinds = []
  verify = verifiers.verify_batch

  def spy(kind, *args, **kwargs):
    kinds.append(kind)
    return verify(kind, *args, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(prm_stages, "policy_sampler",
                  lambda c, p, **k: _ScriptedSampler(c.task))
    patch.setattr(prm_stages, "load_scorer", lambda c, p: _PrefersFives())
    patch.setattr(verifiers, "verify_batch", spy)
    out = prm_eval.best_of_n_file(
        ctx, None, None, path, fields=config_data.task_fields(
            ctx.config.task), num_samples=4)
  # The outcomes are math-verify's (the task's own verifier also runs when
  # the sampled solutions are built, once per batch).
  assert kinds[-1] == "math" and kinds.count("math") == 1
  assert out["prm_eval/problems"] == 2 and out["prm_eval/samples"] == 4
  # Per problem: correct = [0, 1, 0, 0] (the cut one is not finished).
  assert out["prm_eval/pass1"] == 0.25 and out["prm_eval/pass4"] == 1.0
  # Votes over 4: "7" twice, "5" once, the cut one does not vote.
  assert out["prm_eval/bon4_majority"] == 0.0
  assert out["prm_eval/bon1_majority"] == 0.25
  for aggregation in prm_stages.AGGREGATIONS:
    assert out[f"prm_eval/bon4_{aggregation}"] == 1.0
    assert out[f"prm_eval/bon1_{aggregation}"] == 0.25
    # Weighted: "5" 0.9 against "7" 0.2 + 0.2.
    assert out[f"prm_eval/bon4_weighted_{aggregation}"] == 1.0


def test_best_of_n_with_the_checkpoint_policy_and_prm(ctx, tmp_path):
  path = _jsonl(tmp_path / "gsm8k_test.jsonl", BON_ROWS)
  policy = pipeline.initial_params(ctx)
  out = prm_eval.best_of_n_file(
      ctx, policy, _prm(ctx), path,
      fields=config_data.task_fields(ctx.config.task),
      num_samples=4, num_problems=1)
  assert out["prm_eval/problems"] == 1
  for n in (1, 4):
    for key in ("pass", "bon{}_majority", "bon{}_min", "bon{}_last",
                "bon{}_product", "bon{}_weighted_min"):
      name = "prm_eval/" + (f"pass{n}" if key == "pass" else key.format(n))
      assert 0.0 <= out[name] <= out[f"prm_eval/pass{n}"] <= 1.0, name
  table = prm_eval.format_eval_table(out)
  assert "PRM min" in table and "pass@N" in table


def test_processbench_rows_take_the_chat_template(ctx, tmp_path):
  task = ctx.task
  path = _jsonl(tmp_path / "gsm8k.jsonl", [
      {"problem": BON_ROWS[0]["question"], "steps": ["He has 5 apples ."],
       "label": -1},
      {"problem": BON_ROWS[1]["question"],
       "steps": ["He has 5 apples .", "#### 5"], "label": 1}])
  rows = processbench.read_file(path)
  prompts, responses = processbench.encode_rows(task, rows,
                                                max_prompt_len=256)
  # The prompt is the policy's: the chat template with the system prompt.
  tokens, mask = task.encode_prompts(
      [tasks_lib.TextProblem(BON_ROWS[0]["question"], "5", "", 0)])
  assert prompts[0] == tokens[0][mask[0] == 1].tolist()
  rendered = task.tokenizer.format_prompt(BON_ROWS[0]["question"])
  assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>")
  assert responses[0][-1] == task.tokenizer.end_of_turn_id
  scorer = prm_stages.load_scorer(ctx, _prm(ctx))
  scores = processbench.score_rows(
      task, scorer, rows[:1], prompts[:1], responses[:1],
      prompt_width=task.max_prompt_len, response_budget=task.max_new_tokens,
      num_steps=ctx.config.task.max_steps, batch_rows=4)
  assert scores["step_mask"][0].tolist() == [True] + [False] * 7
  assert 0.0 < scores["step_scores"][0, 0] < 1.0
  # This word-level tokenizer drops "\n\n", so two steps score as one: the
  # row is named rather than scored with misplaced boundaries.
  with pytest.raises(errors.InputError, match=f"{path}:2: the tokens split "
                     "into 1 steps"):
    processbench.score_rows(
        task, scorer, rows, prompts, responses,
        prompt_width=task.max_prompt_len,
        response_budget=task.max_new_tokens,
        num_steps=ctx.config.task.max_steps, batch_rows=4)
