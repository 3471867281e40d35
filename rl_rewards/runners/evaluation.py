"""Held-out evaluation of a policy: greedy accuracy, per-k accuracy, pass@n.

Greedy decoding runs in fixed-size batches (the last one padded by repeating
problems, whose results are dropped) so the sampler compiles once per shape.
pass@n samples n responses per problem at temperature 1 in batches of the RL
rollout shape, which the RL stage compiles anyway. The extra held-out sets
of `config.eval.sets` (MATH-500, AIME, ...) are sampled the same way,
`eval.sets_samples` responses a problem, scored with math-verify, and
reported as `eval/NAME/pass@1` and `eval/NAME/pass@K` (K = eval.pass_n).

With several processes, each one encodes, decodes and scores only its own
rows of every batch (`mesh.process_rows`); metrics are ratios of sums and
counts added up over processes (`mesh.process_sums`), so every process
reports the same numbers, equal to a single-process run's.
"""

import numpy as np

from rl_rewards import progress
from rl_rewards.rollout import sampler
from rl_rewards.sharding import mesh as mesh_lib


def _padded_batches(items, batch_size):
  for start in range(0, len(items), batch_size):
    chunk = list(items[start:start + batch_size])
    real = len(chunk)
    while len(chunk) < batch_size:
      chunk.append(chunk[len(chunk) % real])
    yield start, chunk, real


def generate(ctx, params, problems, *, batch_size, rng, temperature,
             num_samples=1, top_p=1.0, progress_desc="generate"):
  """Samples responses for this process's rows of `problems`.

  Each batch of `batch_size` problems is split over the processes; a process
  encodes its prompts only and reads back only its sampled rows.

  Returns:
    dict with, for this process's rows (problem-major, `num_samples` per
    problem; padding rows dropped): `texts` (list), `problems` (the problem
    of each row), `problem_index` [N] int (index into `problems`),
    `finished` [N] bool, `lengths` [N] int32 and `num_tokens` (this
    process's generated tokens).
  """
  task = ctx.task
  if getattr(task, "multi_turn", False):
    return _generate_episodes(ctx, params, problems, batch_size=batch_size,
                              rng=rng, temperature=temperature,
                              num_samples=num_samples, top_p=top_p,
                              progress_desc=progress_desc)
  n = num_samples
  texts, finished, lengths, index = [], [], [], []
  prompt_rows = mesh_lib.process_rows(batch_size, ctx.mesh)
  for i, (first, chunk, real) in enumerate(progress.track(
      _padded_batches(problems, batch_size), progress_desc,
      total=-(-len(problems) // batch_size), unit="batches")):
    tokens, mask = mesh_lib.put_local_batch(
        task.encode_prompts(chunk[prompt_rows]), ctx.mesh, batch_size)
    out = sampler.sample(
        ctx.model_config, params, tokens, mask,
        _fold(rng, i), max_new_tokens=task.max_new_tokens,
        temperature=temperature, top_p=top_p,
        eos_id=task.tokenizer.stop_ids, pad_id=task.tokenizer.pad_id,
        delimiter_mask=task.delimiter_mask(), num_samples=n,
        num_tokens=task.tokenizer.vocab_size)
    host = mesh_lib.local_rows(
        {"tokens": out.tokens, "response_mask": out.response_mask,
         "lengths": out.lengths, "truncated": out.truncated}, ctx.mesh)
    # Global rows of this process; row r samples prompt r // n.
    prompt_of = np.arange(prompt_rows.start * n, prompt_rows.stop * n) // n
    keep = prompt_of < real
    texts.extend(task.decode_responses(host["tokens"][keep],
                                       host["response_mask"][keep]))
    finished.extend(~host["truncated"][keep])
    lengths.extend(host["lengths"][keep])
    index.extend(first + prompt_of[keep])
  lengths = np.asarray(lengths, np.int32)
  index = np.asarray(index, np.int64)
  return {"texts": texts, "problems": [problems[j] for j in index],
          "problem_index": index, "finished": np.asarray(finished, bool),
          "lengths": lengths, "num_tokens": int(lengths.sum())}


def _generate_episodes(ctx, params, problems, *, batch_size, rng,
                       temperature, num_samples, top_p, progress_desc):
  """`generate` for a multi-turn task: `texts` are each episode's list of
  turn texts (what the task's `score` reads), `lengths` its tokens after
  the prompt (turns and observations); one process samples every row."""
  task = ctx.task
  n = num_samples
  texts, finished, lengths, index = [], [], [], []
  for i, (first, chunk, real) in enumerate(progress.track(
      _padded_batches(problems, batch_size), progress_desc,
      total=-(-len(problems) // batch_size), unit="batches")):
    out = task.sample_episodes(ctx.model_config, params, chunk, _fold(rng, i),
                               temperature=temperature, top_p=top_p,
                               num_samples=n)
    prompt_of = np.arange(len(chunk) * n) // n
    for row in np.nonzero(prompt_of < real)[0]:
      texts.append(out.actions[row])
      finished.append(not out.truncated[row])
      lengths.append(out.lengths[row])
      index.append(first + prompt_of[row])
  lengths = np.asarray(lengths, np.int32)
  index = np.asarray(index, np.int64)
  return {"texts": texts, "problems": [problems[j] for j in index],
          "problem_index": index, "finished": np.asarray(finished, bool),
          "lengths": lengths, "num_tokens": int(lengths.sum())}


def _fold(rng, i):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.random.fold_in(rng, i)


def greedy_accuracy(ctx, params, problems, *, batch_size, rng):
  """Greedy accuracy metrics (overall, per number of ops, all-steps-right).

  accuracy = Σ_i r_i / N over the N problems (r_i the 0/1 outcome reward),
  per k over the problems with k operations; each process scores its own
  rows and the sums are added up over processes.
  """
  out = generate(ctx, params, problems, batch_size=batch_size, rng=rng,
                 temperature=0.0, progress_desc="eval greedy")
  scored = ctx.task.score(out["problems"], out["texts"], out["finished"])
  all_steps = [len(l) > 0 and all(l) for l in scored.step_labels]
  step_acc = [np.mean(l) if l else 0.0 for l in scored.step_labels]
  sums = {"rows": len(out["texts"]), "reward": np.sum(scored.rewards,
                                                      dtype=np.float64),
          "length": np.sum(out["lengths"], dtype=np.float64),
          "finished": np.sum(out["finished"]),
          "steps": np.sum(scored.num_steps, dtype=np.float64),
          "all_steps": np.sum(all_steps), "step_acc": np.sum(step_acc)}
  ks = ctx.task.num_ops(problems)
  if ks is not None:
    local_ks = ks[out["problem_index"]]
    for k in np.unique(ks):
      sums[f"reward_k{k}"] = np.sum(scored.rewards[local_ks == k],
                                    dtype=np.float64)
      sums[f"rows_k{k}"] = np.sum(local_ks == k)
  total = mesh_lib.process_sums(sums)
  rows = max(total["rows"], 1)
  result = {
      "eval/accuracy": total["reward"] / rows,
      "eval/mean_length": total["length"] / rows,
      "eval/truncated": 1.0 - total["finished"] / rows,
      "eval/steps_per_response": total["steps"] / rows,
  }
  if ctx.task.has_step_labels:
    result["eval/all_steps_correct"] = total["all_steps"] / rows
    result["eval/step_accuracy"] = total["step_acc"] / rows
  if ks is not None:
    for k in np.unique(ks):
      result[f"eval/accuracy_k{k}"] = (total[f"reward_k{k}"] /
                                       max(total[f"rows_k{k}"], 1))
  return result


def pass_at_n(ctx, params, problems, *, n, prompts_per_batch, rng):
  """Fraction of problems with at least one correct answer in n samples.

  pass@n = (1/N) Σ_i max_j r_ij and mean@n = (1/(N n)) Σ_ij r_ij over N
  problems with n samples each; a problem's n samples are on one process.
  """
  out = generate(ctx, params, problems, batch_size=prompts_per_batch, rng=rng,
                 temperature=1.0, num_samples=n, progress_desc=f"eval pass@{n}")
  scored = ctx.task.score(out["problems"], out["texts"], out["finished"])
  solved = scored.rewards.reshape(-1, n).max(axis=1)
  total = mesh_lib.process_sums({
      "problems": solved.size, "solved": np.sum(solved, dtype=np.float64),
      "reward": np.sum(scored.rewards, dtype=np.float64)})
  count = max(total["problems"], 1)
  return {f"eval/pass@{n}": total["solved"] / count,
          f"eval/mean@{n}": total["reward"] / (count * n)}


def pass_at_k(num_correct, num_samples: int, k: int) -> np.ndarray:
  """Unbiased pass@k of each problem from n samples with c correct.

  pass@k = 1 - C(n - c, k) / C(n, k), the probability that k of the n
  samples drawn without replacement hold a correct one (Chen et al., 2021),
  computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i); 1 when n - c < k.
  With k = n it is 1[c > 0]; with k = 1 it is c / n.

  Args:
    num_correct: [N] correct samples c of each problem.
    num_samples: n, the samples of every problem.
    k: the k of pass@k, 1 <= k <= n.

  Returns:
    [N] float64.
  """
  if not 1 <= k <= num_samples:
    raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={num_samples}.")
  num_correct = np.asarray(num_correct, np.int64)
  out = np.ones(num_correct.shape, np.float64)
  for i, c in enumerate(num_correct):
    if num_samples - c >= k:
      out[i] = 1.0 - np.prod(
          1.0 - k / np.arange(num_samples - c + 1, num_samples + 1))
  return out


def eval_set_metrics(ctx, params, problems, *, name, n, k, prompts_per_batch,
                     temperature, rng):
  """pass@1 and pass@k of one held-out set, n samples a problem.

  pass@1 = (1/N) Σ_i c_i / n and pass@k = (1/N) Σ_i pass_at_k(c_i, n, k)
  over the N problems (c_i of the n samples of problem i correct, scored
  with math-verify); a problem's n samples are on one process, and the sums
  are added up over processes.

  Returns:
    {eval/NAME/pass@1, eval/NAME/pass@K, eval/NAME/mean_length,
     eval/NAME/truncated}.
  """
  out = generate(ctx, params, problems, batch_size=prompts_per_batch,
                 rng=rng, temperature=temperature, num_samples=n,
                 progress_desc=f"eval {name}")
  scored = ctx.task.score(out["problems"], out["texts"], out["finished"],
                          verifier=ctx.task.EVAL_SET_VERIFIER)
  correct = scored.rewards.reshape(-1, n).sum(axis=1).round().astype(np.int64)
  total = mesh_lib.process_sums({
      "problems": correct.size,
      "pass1": np.sum(correct / n, dtype=np.float64),
      "passk": np.sum(pass_at_k(correct, n, k), dtype=np.float64),
      "length": np.sum(out["lengths"], dtype=np.float64),
      "finished": np.sum(out["finished"])})
  count = max(total["problems"], 1)
  prefix = f"eval/{name}/"
  return {prefix + "pass@1": total["pass1"] / count,
          prefix + f"pass@{k}": total["passk"] / count,
          prefix + "mean_length": total["length"] / (count * n),
          prefix + "truncated": 1.0 - total["finished"] / (count * n)}


def evaluate_sets(ctx, params, *, rng):
  """Every held-out set of `config.eval.sets` (see `eval_set_metrics`)."""
  eval_config = ctx.config.eval
  k = eval_config.pass_n
  n = eval_config.sets_samples or k
  result = {}
  for i, name in enumerate(getattr(ctx.task, "eval_set_names", ())):
    problems = ctx.task.eval_set_problems(name, eval_config.sets_size)
    result.update(eval_set_metrics(
        ctx, params, problems, name=name, n=n, k=k,
        prompts_per_batch=ctx.config.rl.prompts_per_step,
        temperature=eval_config.sets_temperature, rng=_fold(rng, 20_000 + i)))
  return result


def evaluate(ctx, params, *, rng, with_pass_n=True):
  """The held-out evaluation of docs/arith_task.md (greedy per k, pass@n).

  With `with_pass_n`, also the held-out sets of `config.eval.sets`.
  """
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
  if with_pass_n:
    result.update(evaluate_sets(ctx, params, rng=rng))
  return result
