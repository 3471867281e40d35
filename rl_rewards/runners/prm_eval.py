"""The PRM evaluation stage (`prm_eval`) and the search-vs-Best-of-N curve.

    summary = run_prm_eval(ctx, policy_params, prm)   # stage "prm_eval"
    print(format_eval_table(summary))
    curves = search_compute_curve(ctx, policy_params, prm, ...)

Held-out solutions are sampled from the policy and scored by the trained
verifier, the task's oracle PRM and a random scorer: ProcessBench-style
first-error F1 (threshold chosen on separate validation problems), step
AUROC, and Best-of-N accuracy with every step-score aggregation and
PRM-weighted voting, against majority vote.
"""

import copy
import time

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards import errors
from rl_rewards import metrics as metrics_lib
from rl_rewards import progress
from rl_rewards.data import readers
from rl_rewards.prm import evaluation as prm_eval_lib
from rl_rewards.prm import labels as labels_lib
from rl_rewards.prm import processbench
from rl_rewards.prm import scoring
from rl_rewards.prm import search as search_lib
from rl_rewards.runners import prm_stages
from rl_rewards.runners import programs
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.tasks import answers as answers_lib


def sample_solutions(ctx, policy, problems, *, num_samples: int, rng,
                     prompts_per_batch: int, split: str = "eval"):
  """`num_samples` solutions per problem (problem-major) as `Solution`s."""
  task = ctx.task
  out = []
  for i, start in enumerate(progress.track(
      range(0, len(problems), prompts_per_batch), "sample solutions",
      unit="batches")):
    chunk = list(problems[start:start + prompts_per_batch])
    real = len(chunk)
    chunk += [chunk[0]] * (prompts_per_batch - real)
    tokens, mask = task.encode_prompts(chunk)
    prompts = labels_lib.response_rows(tokens, mask)
    samples = policy.sample(tokens, mask, jax.random.fold_in(rng, i),
                            num_samples=num_samples)
    keep = real * num_samples
    samples = {k: v[:keep] for k, v in samples.items()}
    rows = [j for j in range(real) for _ in range(num_samples)]
    out.extend(labels_lib.solutions_from_samples(
        task, [chunk[j] for j in rows], [split] * keep,
        [start + j for j in rows], [prompts[j] for j in rows], samples))
  return out


def score_solutions(ctx, scorer, solutions, batch_rows: int) -> dict:
  """Step scores of solutions in fixed-size batches (one compiled shape)."""
  task = ctx.task
  parts = []
  for start in progress.track(range(0, len(solutions), batch_rows),
                              "score solutions", unit="batches"):
    chunk = solutions[start:start + batch_rows]
    batch = scoring.make_solution_batch(
        task, [s.problem for s in chunk], [s.prompt_ids for s in chunk],
        [s.response_ids for s in chunk], prompt_width=task.max_prompt_len,
        response_budget=task.max_new_tokens,
        num_steps=ctx.config.task.max_steps, rows=batch_rows)
    result = scorer.score_batch(batch)
    parts.append({k: v[:len(chunk)] for k, v in result.items()})
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _answer(task, solution):
  if not solution.finished:
    return None
  steps = task.split_steps(solution.text)
  return steps[-1].strip() or None


def _scorers(ctx, prm):
  scorers = {"prm": prm_stages.load_scorer(ctx, prm),
             "random": scoring.RandomScorer(ctx.config.seed)}
  if getattr(ctx.task, "has_step_labels", False):
    scorers["oracle"] = scoring.OracleScorer(ctx.task)
  return scorers


def first_error_sets(ctx, policy, *, rng) -> dict:
  """The held-out solutions of the first-error evaluation.

  One solution per problem of `prm_eval.valid_problems` validation problems
  (split "prm_valid") and `prm_eval.num_problems` test problems
  ("prm_test"), with the task's oracle labels.

  Returns:
    {"valid": ..., "test": ...}, each (solutions, first_errors [N] int,
    step_labels: N lists of bools).
  """
  cfg, task = ctx.config.prm_eval, ctx.task
  data = {}
  for name, split, count in (("valid", "prm_valid", cfg.valid_problems),
                             ("test", "prm_test", cfg.num_problems)):
    problems = task.problems(split, 0, count)
    solutions = sample_solutions(ctx, policy, problems, num_samples=1,
                                 rng=jax.random.fold_in(rng, len(data)),
                                 prompts_per_batch=cfg.prompts_per_batch,
                                 split=split)
    oracle = prm_stages.oracle_fields(task, solutions)
    data[name] = (solutions, np.array([f for _, f in oracle]),
                  [l for l, _ in oracle])
  return data


def processbench_eval(ctx, policy, scorers, *, rng, data=None) -> dict:
  """First-error F1 (threshold chosen on validation problems) and AUROC.

  `data`: `first_error_sets(ctx, policy, rng=rng)` when already sampled.
  """
  batch_rows = ctx.config.prm_eval.prompts_per_batch
  if data is None:
    data = first_error_sets(ctx, policy, rng=rng)
  out = {"prm_eval/erroneous_fraction": float(np.mean(data["test"][1] >= 0))}
  for scorer_name, scorer in scorers.items():
    scores = {name: score_solutions(ctx, scorer, solutions, batch_rows)
              for name, (solutions, _, _) in data.items()}
    threshold, valid_f1 = prm_eval_lib.select_threshold(
        scores["valid"]["step_scores"], scores["valid"]["step_mask"],
        data["valid"][1])
    test = scores["test"]
    metrics = prm_eval_lib.processbench_metrics(
        data["test"][1], prm_eval_lib.first_error_predictions(
            test["step_scores"], test["step_mask"], threshold))
    at_half = prm_eval_lib.processbench_metrics(
        data["test"][1], prm_eval_lib.first_error_predictions(
            test["step_scores"], test["step_mask"], 0.5))
    labels = np.zeros(test["step_scores"].shape, np.float32)
    for b, step_labels in enumerate(data["test"][2]):
      merged = scoring.merge_step_labels(step_labels,
                                         ctx.config.task.max_steps)
      labels[b, :len(merged)] = merged
    suffix = "" if scorer_name == "prm" else f"_{scorer_name}"
    out.update({
        f"prm_eval/f1{suffix}": metrics["f1"],
        f"prm_eval/acc_err{suffix}": metrics["acc_err"],
        f"prm_eval/acc_cor{suffix}": metrics["acc_cor"],
        f"prm_eval/threshold{suffix}": threshold,
        f"prm_eval/valid_f1{suffix}": valid_f1,
        f"prm_eval/f1_at_half{suffix}": at_half["f1"],
        f"prm_eval/auroc{suffix}": prm_eval_lib.step_auroc(
            test["step_scores"], test["step_mask"], labels),
        f"prm_eval/first_error_auroc{suffix}": processbench.file_metrics(
            test["step_scores"], test["step_mask"], data["test"][1],
            threshold)["auroc"],
    })
  return out


def best_of_n_eval(ctx, policy, scorers, *, rng) -> dict:
  """Best-of-N accuracy per aggregation, majority votes, oracle, pass@N."""
  cfg, task = ctx.config.prm_eval, ctx.task
  problems = task.problems("prm_test", 0, cfg.bon_problems)
  m = cfg.bon_samples
  prompts_per_batch = max(1, cfg.prompts_per_batch // min(m, 8))
  solutions = sample_solutions(ctx, policy, problems, num_samples=m, rng=rng,
                               prompts_per_batch=prompts_per_batch,
                               split="prm_test")
  correct = np.array([s.outcome for s in solutions]).reshape(-1, m)
  answers = [[_answer(task, s) for s in solutions[p * m:(p + 1) * m]]
             for p in range(len(problems))]
  return best_of_n_metrics(ctx, scorers, solutions, correct, answers)


def best_of_n_metrics(ctx, scorers, solutions, correct, answers) -> dict:
  """Best-of-N metrics of sampled solutions (M per problem, problem-major).

  For N in 1, 4, 16, ... ≤ M (disjoint groups of N, `prm.evaluation`):
  pass@N, majority vote, and for every scorer and aggregation
  (`prm_stages.AGGREGATIONS`) the accuracy of the highest-scored sample;
  for the "prm" scorer also the PRM-weighted vote.

  Args:
    ctx: the run context.
    scorers: {name: scorer}; "prm" is the trained verifier.
    solutions: P·M `Solution`s.
    correct: [P, M] 0/1 outcomes.
    answers: [P][M] final answers (None: no vote).

  Returns:
    `prm_eval/...` metrics.
  """
  cfg = ctx.config.prm_eval
  correct = np.asarray(correct)
  m = correct.shape[1]
  lengths = np.array([len(s.response_ids) for s in solutions]).reshape(-1, m)
  sizes = [n for n in (1, 4, 16, 64, 256) if n <= m]
  out = {}
  for n in sizes:
    out[f"prm_eval/pass{n}"] = prm_eval_lib.pass_at_n(correct, n)
    out[f"prm_eval/bon{n}_majority"] = prm_eval_lib.majority_vote_accuracy(
        answers, correct, n)
    out[f"prm_eval/tokens{n}"] = float(lengths.mean() * n)
  batch_rows = cfg.prompts_per_batch * 4
  for scorer_name, scorer in scorers.items():
    scores = score_solutions(ctx, scorer, solutions, batch_rows)
    for aggregation in prm_stages.AGGREGATIONS:
      response = aggregate_on_host(scores["step_scores"],
                                   scores["step_mask"],
                                   aggregation).reshape(-1, m)
      prefix = ("prm_eval/bon{n}_" if scorer_name == "prm" else
                f"prm_eval/bon{{n}}_{scorer_name}_")
      for n in sizes:
        out[prefix.format(n=n) + aggregation] = (
            prm_eval_lib.best_of_n_accuracy(response, correct, n))
        if scorer_name == "prm":
          out[f"prm_eval/bon{n}_weighted_{aggregation}"] = (
              prm_eval_lib.majority_vote_accuracy(answers, correct, n,
                                                  weights=response))
  return out


def vote_answer(text: str):
  """The final answer a free-text response votes for in majority voting:
  the last \\boxed{} content, else the text after the last "####", else the
  last number; None when there is none."""
  boxed = answers_lib.last_boxed(text)
  if boxed is not None and boxed.strip():
    return boxed.strip()
  final = answers_lib.gsm8k_final_answer(text)
  if final:
    return final
  numbers = answers_lib.numbers_in(text)
  return numbers[-1].replace(",", "") if numbers else None


def best_of_n_file(ctx, policy_params, prm: prm_stages.TrainedPRM, path: str,
                   *, fields, num_samples: int, num_problems: int = 0,
                   rng=None) -> dict:
  """Best-of-N on a question/answer file (GSM8K/MATH layouts).

  The run's policy samples `num_samples` solutions for each of the first
  `num_problems` problems of `path` (0: all), read with
  `rl_rewards.data.readers` and the field map `fields` (`task.preset`);
  outcomes are checked against the file's answers with math-verify
  (`verifiers.verify_batch("math", ...)`), and `best_of_n_metrics` reports
  PRM Best-of-N with every aggregation and the PRM-weighted vote against
  majority vote and pass@N.

  Raises:
    config_lib.ConfigError: the run's task has no text tokenizer.
    errors.InputError: naming the file and row of a malformed row.
  """
  task = ctx.task
  if not isinstance(task, tasks_lib.TextTask):
    raise config_lib.ConfigError(
        "eval_prm --bon_path: Best-of-N on a file needs a run with a text "
        f"task (gsm8k/math), not {ctx.config.task.name!r}.")
  records = readers.read_records(path, fields)
  if num_problems:
    records = records[:num_problems]
  problems = [tasks_lib.TextProblem(question=r["question"],
                                    answer=r["answer"],
                                    solution=r["solution"], index=r["index"])
              for r in records]
  cfg = ctx.config.prm_eval
  policy = prm_stages.policy_sampler(ctx, policy_params,
                                     temperature=cfg.temperature)
  m = num_samples
  solutions = sample_solutions(
      ctx, policy, problems, num_samples=m,
      rng=ctx.rng("prm_eval/best_of_n_file") if rng is None else rng,
      prompts_per_batch=max(1, cfg.prompts_per_batch // min(m, 8)),
      split="file")
  correct = task.score([s.problem for s in solutions],
                       [s.text for s in solutions],
                       [s.finished for s in solutions],
                       verifier="math").rewards.reshape(-1, m)
  answers = [[vote_answer(s.text) if s.finished else None
              for s in solutions[p * m:(p + 1) * m]]
             for p in range(len(problems))]
  out = best_of_n_metrics(ctx, {"prm": prm_stages.load_scorer(ctx, prm)},
                          solutions, correct, answers)
  out["prm_eval/problems"] = len(problems)
  out["prm_eval/samples"] = m
  return out


# ----------------------------------------------------- ProcessBench files ---


def processbench_scorer(ctx, prm: prm_stages.TrainedPRM, num_steps: int):
  """The verifier's scorer (`programs.scorer`, what RL calls) with
  `num_steps` step slots instead of `config.task.max_steps`."""
  config = copy.deepcopy(ctx.config)
  config.task.max_steps = int(num_steps)
  return programs.scorer(config, ctx.model_config, prm.kind, prm.params,
                         prm.reference, prm.beta)


def processbench_files(ctx, prm: prm_stages.TrainedPRM, rows_by_subset: dict,
                       *, threshold: float = processbench.DEFAULT_THRESHOLD,
                       inner_delimiter: str = "error") -> dict:
  """Scores ProcessBench rows with a verifier; metrics per subset.

  Each row is encoded as the task encodes prompts and responses
  (`processbench.encode_rows`) and scored as RL scores rollouts
  (`processbench.score_rows`, the scorer's `score_batch`). The prompt and
  response widths are the task's (`task.max_prompt_len`,
  `task.max_new_tokens`) when every row fits, else the longest row's; rows
  go `prm_eval.prompts_per_batch` at a time, so held-out solutions of the
  task score exactly as in `processbench_eval`.

  The scorer has `config.task.max_steps` step slots, or the longest row's
  steps when more (`processbench_scorer`).

  Args:
    ctx: the run context.
    prm: the trained verifier.
    rows_by_subset: {subset: rows of `processbench.read_file`}.
    threshold: τ of `processbench.file_metrics`.
    inner_delimiter: "error" or "space" (`processbench.encode_rows`).

  Returns:
    {subset: `processbench.file_metrics(...)`}.
  """
  task = ctx.task
  limit = ctx.model_config.max_position_embeddings
  encoded = {}
  for name, rows in rows_by_subset.items():
    encoded[name] = processbench.encode_rows(
        task, rows, max_prompt_len=limit, inner_delimiter=inner_delimiter)
  longest = lambda i: max(len(ids) for p in encoded.values() for ids in p[i])
  prompt_width = max(task.max_prompt_len, longest(0))
  response_budget = max(task.max_new_tokens, longest(1))
  if prompt_width + response_budget > limit:
    raise config_lib.ConfigError(
        f"the longest prompt ({longest(0)} tokens) and response "
        f"({longest(1)}) exceed the model context of {limit} tokens.")
  num_steps = max([ctx.config.task.max_steps] +
                  [len(r.steps) for rows in rows_by_subset.values()
                   for r in rows])
  scorer = processbench_scorer(ctx, prm, num_steps)
  out = {}
  for name, rows in rows_by_subset.items():
    prompt_ids, response_ids = encoded[name]
    scores = processbench.score_rows(
        task, scorer, rows, prompt_ids, response_ids,
        prompt_width=prompt_width, response_budget=response_budget,
        num_steps=num_steps,
        batch_rows=ctx.config.prm_eval.prompts_per_batch)
    out[name] = processbench.file_metrics(
        scores["step_scores"], scores["step_mask"],
        [r.label for r in rows], threshold)
  return out


def export_processbench(ctx, policy_params, prm: prm_stages.TrainedPRM,
                        path: str) -> dict:
  """Writes the held-out test solutions of the first-error evaluation as a
  ProcessBench file, with the task's oracle first-error labels.

  The solutions are those `evaluate_prm` samples (same random stream): a
  row's `problem` is the question, `steps` the response split at the task's
  delimiter, `label` the step checker's first wrong step (−1 if none) and
  `final_answer_correct` the outcome. The trained verifier is evaluated on
  them in the task's own way too, so that the ProcessBench path can be
  checked against it.

  Returns:
    The in-task first-error metrics of the verifier on these solutions
    (`prm_eval/threshold` chosen on the validation solutions,
    `prm_eval/f1`, `prm_eval/acc_err`, `prm_eval/acc_cor`, ...), plus
    `export/rows` and `export/reencoded_differently`: the rows whose steps
    do not encode back to the sampled tokens (an unfinished response, or
    one ending in the delimiter), on which a learned verifier's scores
    may differ from the in-task ones (a row ending in an empty step cannot
    be scored through the ProcessBench path at all).
  """
  task = ctx.task
  if not getattr(task, "has_step_labels", False):
    raise config_lib.ConfigError(
        "eval_prm --export_processbench: the task has no step labels "
        f"({ctx.config.task.name!r}); the export is for the arith task.")
  cfg = ctx.config.prm_eval
  policy = prm_stages.policy_sampler(ctx, policy_params,
                                     temperature=cfg.temperature)
  data = first_error_sets(ctx, policy, rng=ctx.rng("prm_eval/processbench"))
  solutions, first_errors, _ = data["test"]
  generator = (ctx.config.model.hf_path or
               f"{ctx.config.model.size} policy (seed {ctx.config.seed})")
  rows = [processbench.export_row(
      f"{s.split}-{s.index}", task.prompts([s.problem])[0],
      task.split_steps(s.text), int(first), generator=generator,
      final_answer_correct=bool(s.outcome))
          for s, first in zip(solutions, first_errors)]
  processbench.write_file(path, rows)
  differ = 0
  for solution, row in zip(solutions, processbench.read_file(path)):
    try:
      _, (ids,) = processbench.encode_rows(
          task, [row],
          max_prompt_len=ctx.model_config.max_position_embeddings)
    except errors.InputError:  # E.g. a response ending in an empty step.
      ids = None
    differ += ids != list(solution.response_ids)
  out = processbench_eval(ctx, policy,
                          {"prm": prm_stages.load_scorer(ctx, prm)},
                          rng=None, data=data)
  out["export/rows"] = len(rows)
  out["export/reencoded_differently"] = int(differ)
  return out


def aggregate_on_host(step_scores, step_mask, aggregation) -> np.ndarray:
  """`core.aggregate_step_scores` of host arrays, as numpy."""
  return np.asarray(core.aggregate_step_scores(
      jnp.asarray(step_scores), jnp.asarray(step_mask), aggregation))


def evaluate_prm(ctx, policy_params, prm: prm_stages.TrainedPRM) -> dict:
  """The full PRM evaluation (ProcessBench-style when the task has step
  labels, Best-of-N always); returns `prm_eval/...` metrics."""
  cfg = ctx.config.prm_eval
  policy = prm_stages.policy_sampler(ctx, policy_params, temperature=cfg.temperature)
  scorers = _scorers(ctx, prm)
  out = {}
  t0 = time.time()
  if getattr(ctx.task, "has_step_labels", False):
    out.update(processbench_eval(ctx, policy, scorers,
                                 rng=ctx.rng("prm_eval/processbench")))
  t1 = time.time()
  out.update(best_of_n_eval(ctx, policy, scorers,
                            rng=ctx.rng("prm_eval/best_of_n")))
  out["time/processbench_s"] = t1 - t0
  out["time/best_of_n_s"] = time.time() - t1
  return out


def format_eval_table(summary: dict) -> str:
  """A human-readable table of `evaluate_prm`'s metrics."""
  lines = []
  if "prm_eval/f1" in summary:
    lines.append("first-error identification (test; threshold chosen on "
                 "validation problems)")
    lines.append(f"  {'scorer':<8} {'F1':>6} {'acc_err':>8} {'acc_cor':>8} "
                 f"{'tau':>5} {'F1@.5':>6} {'AUROC':>6}")
    for name, suffix in (("prm", ""), ("oracle", "_oracle"),
                         ("random", "_random")):
      if f"prm_eval/f1{suffix}" not in summary:
        continue
      get = lambda key, s=suffix: summary[f"prm_eval/{key}{s}"]
      lines.append(f"  {name:<8} {get('f1'):6.3f} {get('acc_err'):8.3f} "
                   f"{get('acc_cor'):8.3f} {get('threshold'):5.2f} "
                   f"{get('f1_at_half'):6.3f} {get('auroc'):6.3f}")
  sizes = sorted(int(k[len("prm_eval/pass"):]) for k in summary
                 if k.startswith("prm_eval/pass"))
  if sizes:
    lines.append("Best-of-N accuracy")
    lines.append("  " + f"{'N':<22}" + "".join(f"{n:>7}" for n in sizes))
    rows = [("majority vote", "bon{n}_majority")]
    rows += [(f"PRM {a}", f"bon{{n}}_{a}") for a in prm_stages.AGGREGATIONS]
    rows += [(f"PRM-weighted vote {a}", f"bon{{n}}_weighted_{a}")
             for a in ("min", "last")]
    rows += [("oracle min", "bon{n}_oracle_min"),
             ("random last", "bon{n}_random_last"), ("pass@N", "pass{n}")]
    for label, key in rows:
      values = [summary.get("prm_eval/" + key.format(n=n)) for n in sizes]
      if any(v is None for v in values):
        continue
      lines.append("  " + f"{label:<22}" + "".join(f"{v:7.3f}"
                                                    for v in values))
  return "\n".join(lines)


def _load_prm_for_eval(ctx, prm):
  if prm is not None:
    return prm
  source = ctx.config.prm.init_from or ctx.workdir
  prm, _ = prm_stages.load_finished_prm(ctx, source)
  return prm


def run_prm_eval(ctx, policy_params, prm=None) -> dict:
  """Runs (or reuses) the PRM evaluation stage; returns its summary."""
  ckpt = ctx.checkpointer(prm_stages.EVAL_STAGE)
  done = ckpt.done_info()
  if done is not None:
    ckpt.close()
    print("[prm_eval] reusing the finished stage")
    return done["summary"]
  prm = _load_prm_for_eval(ctx, prm)
  summary = evaluate_prm(ctx, policy_params, prm)
  ctx.writer.write(prm_stages.EVAL_STAGE, 0, summary)
  print(format_eval_table(summary), flush=True)
  ckpt.mark_done(0, summary)
  ckpt.close()
  return summary


# ---------------------------------------------------------------- search ---


def search_compute_curve(ctx, policy_params, prm: prm_stages.TrainedPRM, *,
                         num_problems: int, beam_widths, candidates: int,
                         best_of_n, alpha: float, prover_k: int,
                         aggregation: str = "last", modes=("prm", "pav"),
                         temperature: float = 1.0, step_tokens: int = 16,
                         split: str = "prm_test") -> dict:
  """Accuracy against generated tokens: beam search vs PRM Best-of-N.

  Returns:
    dict with `best_of_n` and one entry per search mode: lists of
    {"budget", "tokens_per_problem", "accuracy"} points.
  """
  task = ctx.task
  problems = task.problems(split, 0, num_problems)
  policy = prm_stages.policy_sampler(ctx, policy_params, temperature=temperature)
  scorer = prm_stages.load_scorer(ctx, prm)
  num_steps = ctx.config.task.max_steps
  curves = {"best_of_n": []}
  largest = max(best_of_n)
  solutions = sample_solutions(ctx, policy, problems, num_samples=largest,
                               rng=ctx.rng("search/best_of_n"),
                               prompts_per_batch=max(1, 256 // largest),
                               split=split)
  correct = np.array([s.outcome for s in solutions]).reshape(-1, largest)
  lengths = np.array([len(s.response_ids) for s in solutions]).reshape(
      -1, largest)
  oracle = scoring.OracleScorer(task, as_value=True)
  bon_scorers = {"best_of_n": scorer}
  if any(mode.startswith("oracle_") for mode in modes):
    bon_scorers["oracle_best_of_n"] = oracle
  for name, bon_scorer in bon_scorers.items():
    scores = score_solutions(ctx, bon_scorer, solutions, 256)
    response = aggregate_on_host(scores["step_scores"], scores["step_mask"],
                                 aggregation).reshape(-1, largest)
    curves[name] = [{
        "budget": n, "tokens_per_problem": float(lengths.mean() * n),
        "accuracy": prm_eval_lib.best_of_n_accuracy(response, correct, n)}
                    for n in sorted(best_of_n)]
  for mode in modes:
    curves[mode] = []
    # `oracle_prm` / `oracle_pav`: the same search guided by a perfect prover
    # (the task's step checker), the upper bound of a learned verifier.
    guide = oracle if mode.startswith("oracle_") else scorer
    for width in progress.track(beam_widths, f"search {mode}",
                                unit="beam rows",
                                weight=lambda w: w * len(problems)):
      t0 = time.time()
      result = search_lib.beam_search(
          policy, guide, task, problems, beam_width=width,
          candidates=candidates, rng=ctx.rng(f"search/{mode}", width),
          prompt_width=task.max_prompt_len,
          response_budget=task.max_new_tokens, num_steps=num_steps,
          step_tokens=step_tokens, max_rounds=num_steps + 2,
          mode=mode.removeprefix("oracle_"),
          aggregation=aggregation, alpha=alpha, prover_k=prover_k)
      curves[mode].append({
          "budget": width,
          "tokens_per_problem": float(result.generated_tokens.mean()),
          "accuracy": float(result.correct.mean()),
          "seconds": time.time() - t0})
      metrics_lib.print_status(
          f"[search] {mode} beam {width}x{candidates}: accuracy "
          f"{result.correct.mean():.3f} at "
          f"{result.generated_tokens.mean():.0f} tokens/problem")
  return curves
