"""Held-out evaluation of a policy: greedy accuracy, per-k accuracy, pass@n.

Greedy decoding runs in fixed-size batches (the last one padded by repeating
problems, whose results are dropped) so the sampler compiles once per shape.
pass@n samples n responses per problem at temperature 1 in batches of the RL
rollout shape, which the RL stage compiles anyway.
"""

import numpy as np

from rl_rewards.rollout import sampler
from rl_rewards.sharding import mesh as mesh_lib


def _padded_batches(items, batch_size):
  for start in range(0, len(items), batch_size):
    chunk = list(items[start:start + batch_size])
    real = len(chunk)
    while len(chunk) < batch_size:
      chunk.append(chunk[len(chunk) % real])
    yield chunk, real


def generate(ctx, params, problems, *, batch_size, rng, temperature,
             num_samples=1, top_p=1.0):
  """Samples responses for `problems`; returns host arrays and texts.

  Returns:
    dict with `texts` (list, problem-major, `num_samples` per problem),
    `finished` [N] bool, `lengths` [N] int32 and `num_tokens` (generated).
  """
  task = ctx.task
  texts, finished, lengths = [], [], []
  for i, (chunk, real) in enumerate(_padded_batches(problems, batch_size)):
    tokens, mask = task.encode_prompts(chunk)
    tokens, mask = mesh_lib.put_batch((tokens, mask), ctx.mesh)
    out = sampler.sample(
        ctx.model_config, params, tokens, mask,
        _fold(rng, i), max_new_tokens=task.max_new_tokens,
        temperature=temperature, top_p=top_p,
        eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id,
        delimiter_mask=task.delimiter_mask(), num_samples=num_samples)
    host = mesh_lib.to_host(
        {"tokens": out.tokens, "response_mask": out.response_mask,
         "lengths": out.lengths, "truncated": out.truncated})
    keep = real * num_samples
    texts.extend(task.decode_responses(host["tokens"][:keep],
                                       host["response_mask"][:keep]))
    finished.extend(~host["truncated"][:keep])
    lengths.extend(host["lengths"][:keep])
  lengths = np.asarray(lengths, np.int32)
  return {"texts": texts, "finished": np.asarray(finished, bool),
          "lengths": lengths, "num_tokens": int(lengths.sum())}


def _fold(rng, i):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.random.fold_in(rng, i)


def greedy_accuracy(ctx, params, problems, *, batch_size, rng):
  """Greedy accuracy metrics (overall, per number of ops, all-steps-right)."""
  out = generate(ctx, params, problems, batch_size=batch_size, rng=rng,
                 temperature=0.0)
  scored = ctx.task.score(problems, out["texts"], out["finished"])
  ks = ctx.task.num_ops(problems)
  all_steps = np.array([len(l) > 0 and all(l) for l in scored.step_labels])
  step_acc = np.mean([np.mean(l) if l else 0.0 for l in scored.step_labels])
  result = {
      "eval/accuracy": float(scored.rewards.mean()),
      "eval/mean_length": float(out["lengths"].mean()),
      "eval/truncated": float(1.0 - out["finished"].mean()),
      "eval/steps_per_response": float(scored.num_steps.mean()),
  }
  if ctx.task.has_step_labels:
    result["eval/all_steps_correct"] = float(all_steps.mean())
    result["eval/step_accuracy"] = float(step_acc)
  if ks is not None:
    for k in np.unique(ks):
      result[f"eval/accuracy_k{k}"] = float(scored.rewards[ks == k].mean())
  return result


def pass_at_n(ctx, params, problems, *, n, prompts_per_batch, rng):
  """Fraction of problems with at least one correct answer in n samples."""
  out = generate(ctx, params, problems, batch_size=prompts_per_batch, rng=rng,
                 temperature=1.0, num_samples=n)
  repeated = [p for p in problems for _ in range(n)]
  scored = ctx.task.score(repeated, out["texts"], out["finished"])
  solved = scored.rewards.reshape(len(problems), n).max(axis=1)
  return {f"eval/pass@{n}": float(solved.mean()),
          f"eval/mean@{n}": float(scored.rewards.mean())}


def evaluate(ctx, params, *, rng, with_pass_n=True):
  """The full held-out evaluation of DESIGN §6 (greedy per k, pass@n)."""
  eval_config = ctx.config.eval
  problems = ctx.task.problems_per_k("eval", eval_config.size_per_k)
  result = greedy_accuracy(ctx, params, problems,
                           batch_size=eval_config.batch_size, rng=rng)
  if with_pass_n and eval_config.pass_n > 1:
    rng_pass = _fold(rng, 10_000)
    # Every k equally represented: the first pass_size // #k problems per k.
    per_k = max(1, eval_config.pass_size // len(ctx.task.ops_range))
    subset = [p for i, p in enumerate(problems)
              if i % eval_config.size_per_k < per_k]
    result.update(pass_at_n(ctx, params, subset, n=eval_config.pass_n,
                            prompts_per_batch=ctx.config.rl.prompts_per_step,
                            rng=rng_pass))
  return result
