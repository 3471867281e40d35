r"""Adversarial model output through every verifier and the step checker.

Runs the corpus of `hostile_corpus` (>= 300 responses: million-digit
numbers, braces and \frac nested 10^4 deep, megabyte strings, unicode
look-alikes, regex and sympy bombs, half-finished LaTeX, objects that are
not strings, seeded random mixtures) through

  exact, gsm8k          `verifiers.verify_batch`, in process
  math, reasoning_gym   `verifiers.verify_batch`, in worker processes
  step_checker          `arith.check_solution`, in process

in batches, as training calls them, and reports for each: how many calls
ended ok, oversize (rejected unparsed), timeout, error (the scorer raised),
crash (the worker died and was replaced), wrong_type; the longest call and
the longest batch; and the throughput in verifications per second. The
right answers of the corpus's `normal` items must still score 1.

  python -m experiments.benchmarks.hostile --out=/tmp/hostile.json

For comparison, the same number of ordinary responses
(`hostile_corpus.ordinary`) is timed the same way (`--noordinary` skips it).
"""

import collections
import time

from absl import app
from absl import flags
from absl import logging

from experiments.benchmarks import hostile_corpus
from experiments.benchmarks import results as results_lib
from rl_rewards.tasks import arith
from rl_rewards.tasks import verifiers

VERIFIERS = ("exact", "gsm8k", "math", "reasoning_gym", "step_checker")
STATUSES = ("ok", "oversize", "timeout", "error", "crash", "wrong_type")

_SEED = flags.DEFINE_integer("seed", 0, "Seed of the corpus's fuzz items.", allow_override=True)
_NUM_FUZZ = flags.DEFINE_integer("num_fuzz", 150, "Random corpus items.")
_TIMEOUT = flags.DEFINE_float("timeout_s", verifiers.DEFAULT_TIMEOUT_S,
                              "Time limit per pooled verifier call.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Responses per call of "
                              "verify_batch (a training batch).")
_WORKERS = flags.DEFINE_integer("num_workers", 2, "Verifier worker processes.")
_ONLY = flags.DEFINE_list("verifiers", list(VERIFIERS), "Which to run.")
_ORDINARY = flags.DEFINE_bool(
    "ordinary", True, "Also time as many ordinary responses, for comparison.")
# Benchmark modules share the name --out (tests import several into one
# process), so each definition may override another.
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.",
                           allow_override=True)


def _reference(name):
  """(the reference of every item, the right answer text) of a verifier."""
  if name == "reasoning_gym":
    # pylint: disable-next=g-import-not-at-top
    from rl_rewards.tasks import reasoning_gym_tasks
    entry = reasoning_gym_tasks.create_dataset("chain_sum", 1, 0)[0]
    return entry, str(entry["answer"])
  if name == "step_checker":
    problem = arith.make_problem(arith.ArithConfig(), 0)
    return problem, arith.reference_solution(problem)
  return {"exact": ("42", "42"), "gsm8k": ("#### 42", "42"),
          "math": ("42", "42")}[name]


def _check_steps(problem, texts):
  """The step checker over a batch: (ok flags, statuses, max call s)."""
  correct, statuses, longest = [], [], 0.0
  for text in texts:
    start = time.perf_counter()
    try:
      verdict = arith.check_solution(problem, text)
      correct.append(bool(verdict.answer_correct))
      statuses.append("ok")
    except ValueError:  # A clear error for a non-str response.
      correct.append(False)
      statuses.append("wrong_type" if not isinstance(text, str) else "error")
    except Exception:  # pylint: disable=broad-except
      correct.append(False)
      statuses.append("error")
    longest = max(longest, time.perf_counter() - start)
  return correct, collections.Counter(statuses), longest


def run_verifier(name, items, *, timeout_s, batch_size, pool):
  """Runs one verifier over `items`, in batches within each category.

  Returns:
    {"counts": {status: n}, "by_category": {category: {status: n}},
     "max_call_s", "max_batch_s", "seconds", "verifications_per_s",
     "right_answer_scored" (the `normal` item "bare answer" scored 1),
     "limit_s" (pooled kinds: the time limit of a call), "restarts"}.
  """
  reference, answer = _reference(name)
  counts = collections.Counter({s: 0 for s in STATUSES})
  by_category = collections.defaultdict(collections.Counter)
  max_call, max_batch, right_answer = 0.0, 0.0, None
  batches = []
  for category in hostile_corpus.CATEGORIES:
    members = [item for item in items if item.category == category]
    batches += [members[i:i + batch_size]
                for i in range(0, len(members), batch_size)]
  if name != "step_checker":
    # Start the workers and their imports before the clock runs.
    verifiers.verify_batch(name, [answer], [reference], timeout_s=timeout_s,
                           pool=pool)
  start = time.perf_counter()
  for batch in batches:
    texts = [hostile_corpus.fill(item.text, answer) for item in batch]
    batch_start = time.perf_counter()
    if name == "step_checker":
      scores, batch_counts, longest = _check_steps(reference, texts)
    else:
      scores, stats = verifiers.verify_batch(
          name, texts, [reference] * len(texts), timeout_s=timeout_s,
          pool=pool)
      batch_counts = collections.Counter(
          oversize=stats.oversize, timeout=stats.timeouts,
          error=stats.errors, crash=stats.crashes,
          wrong_type=stats.wrong_type)
      batch_counts["ok"] = stats.calls - sum(batch_counts.values())
      longest = stats.max_call_s
    max_batch = max(max_batch, time.perf_counter() - batch_start)
    max_call = max(max_call, longest)
    counts.update(batch_counts)
    by_category[batch[0].category].update(
        {k: v for k, v in batch_counts.items() if v})
    for item, score in zip(batch, scores):
      if item.category == "normal" and item.name == "bare answer":
        right_answer = bool(score)
  seconds = time.perf_counter() - start
  pooled = name in ("math", "reasoning_gym")
  return {
      "counts": dict(counts),
      "by_category": {k: dict(v) for k, v in by_category.items()},
      "max_call_s": max_call, "max_batch_s": max_batch, "seconds": seconds,
      "verifications_per_s": len(items) / seconds,
      "right_answer_scored": right_answer,
      "limit_s": timeout_s + verifiers.KILL_GRACE_S if pooled else None,
      "restarts": pool.restarts if pooled else 0,
  }


def run(items, *, names=VERIFIERS, timeout_s=verifiers.DEFAULT_TIMEOUT_S,
        batch_size=64, num_workers=2):
  """Every verifier in `names` over `items`; {name: result} (see above)."""
  results = {}
  for name in names:
    pool = verifiers.VerifierPool(num_workers=num_workers)
    try:
      results[name] = run_verifier(name, items, timeout_s=timeout_s,
                                   batch_size=batch_size, pool=pool)
    finally:
      pool.close()
    logging.info("hostile corpus, %s: %s", name, results[name]["counts"])
  return results


def table(results, num_items) -> str:
  """A Markdown table of `run`'s results."""
  lines = ["| verifier | " + " | ".join(STATUSES) +
           " | max call (s) | limit (s) | max batch (s) | verifications/s |",
           "|---|" + "---:|" * (len(STATUSES) + 4)]
  for name, r in results.items():
    limit = f"{r['limit_s']:.1f}" if r["limit_s"] else "—"
    lines.append(
        f"| {name} | " + " | ".join(str(r["counts"][s]) for s in STATUSES) +
        f" | {r['max_call_s']:.3f} | {limit} | {r['max_batch_s']:.2f} | "
        f"{r['verifications_per_s']:,.0f} |")
  lines.append(f"\n{num_items} responses per verifier.")
  return "\n".join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  start = results_lib.started()
  items = hostile_corpus.corpus(_SEED.value, _NUM_FUZZ.value)
  categories = collections.Counter(item.category for item in items)
  print(f"corpus: {len(items)} responses; " +
        ", ".join(f"{k} {v}" for k, v in categories.items()), flush=True)
  settings = dict(names=_ONLY.value, timeout_s=_TIMEOUT.value,
                  batch_size=_BATCH.value, num_workers=_WORKERS.value)
  results = run(items, **settings)
  print("\nhostile corpus\n" + table(results, len(items)))
  out = {"corpus_size": len(items), "categories": dict(categories),
         "timeout_s": _TIMEOUT.value, "batch_size": _BATCH.value,
         "num_workers": _WORKERS.value, "results": results}
  if _ORDINARY.value:
    ordinary = hostile_corpus.ordinary(len(items), _SEED.value)
    out["ordinary"] = run(ordinary, **settings)
    print("\nordinary responses\n" + table(out["ordinary"], len(ordinary)))
  if _OUT.value:
    results_lib.write(_OUT.value, out, start)


if __name__ == "__main__":
  app.run(main)
