r"""Multi-turn episode throughput beside the single-turn sampler's.

Both sides use the same model, prompts and total length: the single-turn
sampler generates G = `--episode_tokens` tokens per row without EOS; the
episode rollout fills the same G slots with policy turns (each ending on a
newline or after `--turn_tokens` tokens) and the environment's fixed reply
(`--observation` text) after every turn, until the context is full, never
stopping on EOS. Reported: episode tokens (policy + observations) per
second on both sides, policy tokens per second, turns per episode, and the
ratio; times are medians of `--repeats` calls after one warm-up call each
(compile time reported apart), the two sides alternating so that machine
noise hits both. Both sample at temperature 1 with the same key.

  python -m experiments.benchmarks.episodes --model_size=tiny,small \
      --batches=64 --out=docs/results/episodes.json

The table of docs/performance.md is rendered from that file
(`python -m experiments.benchmarks.results docs/results/episodes.json`).
"""

import json
import os
import statistics
import time

from absl import app
from absl import flags
import jax

from experiments.benchmarks import results
from rl_rewards import models
from rl_rewards.envs import batched
from rl_rewards.rollout import episodes
from rl_rewards.rollout import sampler
from rl_rewards.tasks import hidden_operands
from rl_rewards.tasks import tokenizer as tokenizer_lib

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON results.",
                           allow_override=True)
_SIZES = flags.DEFINE_list("model_size", ["tiny"],
                           "Model presets, comma-separated.")
_BATCHES = flags.DEFINE_list("batches", ["64"], "Batch sizes.",
                            allow_override=True)
_EPISODE_TOKENS = flags.DEFINE_integer(
    "episode_tokens", 96, "G: tokens after the prompt on both sides.")
_TURN_TOKENS = flags.DEFINE_integer("turn_tokens", 16,
                                    "Most tokens per policy turn.")
_OBSERVATION = flags.DEFINE_string("observation", "x1=07\n",
                                   "The environment's reply to every turn.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 24, "Prompt slots.",
                                   allow_override=True)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per side.",
                                allow_override=True)


class FixedReplyEnv:
  """Never done; answers every turn with the same text."""

  def __init__(self, reply: str):
    self.reply = reply

  def reset(self, problem):
    return problem.question

  def step(self, action):
    del action
    return self.reply, 0.0, False, {}


def _seconds(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _bench(size, cfg, params, tokenizer, batch):
  problems = hidden_operands.make_problems(
      hidden_operands.HiddenOperandsConfig(), "train", range(batch))
  prompts, mask = tokenizer_lib.encode_prompts(
      tokenizer, [p.question for p in problems], _PROMPT_LEN.value)
  total = _EPISODE_TOKENS.value
  newline = tokenizer.encode("\n")[0]
  reply_tokens = len(tokenizer.encode(_OBSERVATION.value))

  def single():
    out = sampler.sample(cfg, params, prompts, mask, jax.random.key(0),
                         max_new_tokens=total, eos_id=None,
                         pad_id=tokenizer.pad_id)
    return jax.block_until_ready(out.tokens)

  def multi():
    env = batched.BatchedEnv(lambda: FixedReplyEnv(_OBSERVATION.value))
    return episodes.sample_episodes(
        cfg, params, env, problems, tokenizer, jax.random.key(0),
        max_prompt_len=_PROMPT_LEN.value, max_episode_tokens=total,
        max_turns=total, max_turn_tokens=_TURN_TOKENS.value,
        max_observation_tokens=max(reply_tokens, 1),
        end_of_turn_ids=[newline], eos_id=())

  single_compile = _seconds(single)
  start = time.perf_counter()
  out = multi()
  multi_compile = time.perf_counter() - start
  single_s, multi_s = [], []
  for _ in range(_REPEATS.value):  # Alternating, so noise hits both.
    single_s.append(_seconds(single))
    multi_s.append(_seconds(multi))
  single_s, multi_s = statistics.median(single_s), statistics.median(multi_s)
  episode_tokens = int(out.lengths.sum())
  policy_tokens = int(out.response_mask.sum())
  # A turn's decode loop runs until the batch's longest turn ends: the
  # decode steps of the episodes, against the single-turn side's G.
  decode_steps = sum(int((out.turn_ids == k).sum(axis=1).max())
                     for k in range(int(out.num_turns.max())))
  return {
      "size": size, "params": models.num_params(cfg),
      "vocab_size": cfg.vocab_size, "batch": batch, "episode_tokens": total,
      "prompt_len": _PROMPT_LEN.value,
      "turn_tokens": _TURN_TOKENS.value,
      "single_tokens_per_s": batch * total / single_s,
      "episode_tokens_per_s": episode_tokens / multi_s,
      "policy_tokens_per_s": policy_tokens / multi_s,
      "ratio": (episode_tokens / multi_s) / (batch * total / single_s),
      "mean_turns": float(out.num_turns.mean()),
      "episode_decode_steps": decode_steps,
      "filled": episode_tokens / (batch * total),
      "single_s": single_s, "episodes_s": multi_s,
      "single_first_call_s": single_compile,
      "episodes_first_call_s": multi_compile,
  }


def _print_table(rows):
  header = ("size", "batch", "G", "turns", "single tok/s", "episode tok/s",
            "policy tok/s", "episode/single")
  print(" | ".join(header))
  for r in rows:
    print(" | ".join([
        r["size"], str(r["batch"]), str(r["episode_tokens"]),
        f"{r['mean_turns']:.1f}",
        f"{r['single_tokens_per_s']:.0f}", f"{r['episode_tokens_per_s']:.0f}",
        f"{r['policy_tokens_per_s']:.0f}", f"{r['ratio']:.2f}"]))


def main(argv):
  del argv
  start = results.started()
  tokenizer = hidden_operands.make_tokenizer()
  rows = []
  for size in _SIZES.value:
    cfg = models.preset(size, tokenizer.vocab_size)
    params = models.init_params(cfg, jax.random.key(0))
    for batch in _BATCHES.value:
      row = _bench(size, cfg, params, tokenizer, int(batch))
      rows.append(row)
      print(json.dumps(row), flush=True)
  print(f"\ncpus: {os.cpu_count()}, backend: {jax.default_backend()}")
  _print_table(rows)
  if _OUT.value:
    results.write(_OUT.value, {"rows": rows, "cpu_count": os.cpu_count(),
                               "repeats": _REPEATS.value}, start)


if __name__ == "__main__":
  app.run(main)
