"""Prints the worked example of docs/data_model.md (one group through every
estimator), computed with `rl_rewards.core` itself.

    python docs/worked_example.py            # prints the markdown block

tests/docs_test.py checks that the block in docs/data_model.md is exactly
what this script prints, so the numbers in the documentation cannot drift
from the code.
"""

import jax.numpy as jnp
import numpy as np

from rl_rewards import core
from rl_rewards.tasks import arith
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib

PROMPT_LEN = 12


def _fmt(values, digits=3):
  """Nested lists of numbers with at most `digits` decimals."""
  if isinstance(values, (list, tuple, np.ndarray, jnp.ndarray)):
    return "[" + ", ".join(_fmt(v, digits) for v in
                           np.asarray(values).tolist()) + "]"
  if isinstance(values, bool):
    return str(values)
  if isinstance(values, float):
    v = round(values, digits) + 0.0  # No "-0.0".
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") if v else "0"
  return str(values)


def _row(name, values, digits=3):
  return f"{name:<31}{_fmt(values, digits)}"


def _by_step(token_values, step_ids, row):
  """The value at the first token of each step of `row` (constant within a
  step for these estimators, apart from zeroed step-end tokens)."""
  values, ids = np.asarray(token_values)[row], np.asarray(step_ids)[row]
  return [float(values[np.argmax(ids == k)]) for k in range(ids.max() + 1)]


def build():
  """The group: one problem, a correct and a faulty response (n = 2)."""
  problem = arith.problem_from_chain(23, "+-", [7, 15])
  good = arith.reference_solution(problem)
  bad = "023+07=030\n030-15=025\n#025"
  tok = tokenizer_lib.CharTokenizer()
  prompts, prompt_mask = tokenizer_lib.encode_prompts(
      tok, [problem.question] * 2, PROMPT_LEN)
  responses = [tok.encode(good) + [tok.eos_id], tok.encode(bad) + [tok.eos_id]]
  length = PROMPT_LEN + max(len(r) for r in responses)
  tokens = np.full((2, length), tok.pad_id, np.int32)
  response_mask = np.zeros((2, length), np.int32)
  tokens[:, :PROMPT_LEN] = prompts
  for b, r in enumerate(responses):
    tokens[b, PROMPT_LEN:PROMPT_LEN + len(r)] = r
    response_mask[b, PROMPT_LEN:PROMPT_LEN + len(r)] = 1
  step_ids = segmentation.step_ids_from_tokens(
      jnp.asarray(tokens), jnp.asarray(response_mask),
      jnp.asarray(tok.delimiter_mask("\n")), eos_id=tok.eos_id)
  labels = [arith.check_solution(problem, text) for text in (good, bad)]
  return problem, (good, bad), tok, tokens, response_mask, np.asarray(
      step_ids), labels


def main():
  problem, texts, tok, tokens, response_mask, step_ids, labels = build()
  mask = jnp.asarray(response_mask)
  ids = jnp.asarray(step_ids)
  num_steps = 3
  step_mask = core.step_mask_from_ids(ids, num_steps)
  rewards = jnp.array([1.0 if l.answer_correct else 0.0 for l in labels])
  lines = []
  say = lines.append

  say("```")
  say(f"question: {problem.question!r}   (true answer {problem.answer})")
  for b, text in enumerate(texts):
    say(f"response {b}: {text!r}")
  say("")
  chars = ["·" if t == tok.pad_id else "^" if t == tok.bos_id else
           "$" if t == tok.eos_id else "⏎" if t == tok.encode("\n")[0]
           else tok.decode([t]) for t in tokens[1]]
  say("row 1, slot by slot (· pad, ^ BOS, $ EOS, ⏎ newline):")
  say("  tokens        " + " ".join(f"{c:>2}" for c in chars))
  say("  response_mask " + " ".join(f"{m:>2}" for m in response_mask[1]))
  say("  step_ids      " + " ".join(f"{s:>2}" for s in step_ids[1]))
  say("")
  say(_row("step labels (checker)", [[bool(x) for x in l.labels] for l in labels]))
  say(_row("first_error", [l.first_error for l in labels]))
  say(_row("outcome reward r", rewards))
  say(_row("step_mask [B, S=3]", np.asarray(step_mask).astype(int).tolist()))
  say("")
  say("Outcome baselines (scores [B] -> [B], broadcast to response tokens):")
  for est in ("grpo", "drgrpo", "rloo"):
    say(_row(f"  {est}", core.group_advantages(rewards, 2, estimator=est)))
  say("")
  say("PAV, with a learned Q^pi per step and V^pi of the question "
      "(illustrative values), prover Best-of-4, alpha = 1:")
  q_pi = jnp.array([[0.6, 0.8, 0.95], [0.6, 0.2, 0.1]])
  v_pi = jnp.array([0.5, 0.5])
  q_mu = core.best_of_k(q_pi, 4)
  v_mu = core.best_of_k(v_pi, 4)
  a_mu = core.progress(q_mu, v_mu, step_mask)
  outcome = core.group_advantages(rewards, 2, estimator="grpo")
  pav = core.pav_advantages(outcome, a_mu, ids, mask, alpha=1.0)
  say(_row("  Q^mu = 1-(1-Q^pi)^4", q_mu.tolist()))
  say(_row("  V^mu", v_mu))
  say(_row("  A^mu_k = Q^mu_k - Q^mu_k-1", a_mu.tolist()))
  say(_row("  advantage by step, row 0", _by_step(pav, step_ids, 0)))
  say(_row("  advantage by step, row 1", _by_step(pav, step_ids, 1)))
  say("")
  say("PAV with the oracle (perfect prover: Q = 1 until the first wrong step):")
  q_or = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
  a_or = core.progress(q_or, jnp.ones(2), step_mask)
  say(_row("  A^mu_k", a_or.tolist()))
  say("")
  say("PURE, PRM probabilities p -> r = 2p - 1, softmin T = 0.1, token "
      "RLOO baseline, verifiable reward, returns, step ends zeroed, "
      "normalised:")
  p = jnp.array([[0.9, 0.8, 0.95], [0.9, 0.3, 0.2]])
  r = 2 * p - 1
  say(_row("  r_k", r.tolist()))
  say(_row("  r*_k (softmin)",
           core.softmin_step_rewards(r, step_mask, 0.1).tolist()))
  say(_row("  min-form G_k", core.min_form_returns(r, step_mask).tolist()))
  adv, ret = core.pure_advantages(r, ids, mask, 2, temperature=0.1,
                                  solved=rewards)
  say(_row("  returns by step, row 0", _by_step(ret, step_ids, 0)))
  say(_row("  returns by step, row 1", _by_step(ret, step_ids, 1)))
  say(_row("  advantages by step, row 1", _by_step(adv, step_ids, 1)))
  say(_row("  step-end advantages, row 1",
           np.asarray(adv)[1][np.asarray(core.step_end_mask_from_ids(ids))[1]]))
  say("")
  say("PRIME, implicit rewards beta*(log pi_phi - log pi_ref) (illustrative "
      "log-ratios: +0.2 on row 0's tokens, -0.2 on row 1's):")
  log_ratio = jnp.where(mask > 0, jnp.array([[0.2], [-0.2]]), 0.0)
  implicit = core.implicit_token_rewards(log_ratio, jnp.zeros_like(log_ratio),
                                         mask, beta=0.05)
  adv, ret = core.prime_advantages(implicit, rewards, mask, 2,
                                   process_coef=5.0, outcome_coef=5.0)
  say(_row("  returns, row 0 (first 4)", np.asarray(ret)[0, PROMPT_LEN:
                                                         PROMPT_LEN + 4]))
  say(_row("  advantages, row 1 (first 4)", np.asarray(adv)[1, PROMPT_LEN:
                                                            PROMPT_LEN + 4]))
  say("")
  say("PPO/GAE, outcome on the last token, values V_t = 0.5, gamma = 1, "
      "lambda = 0.95:")
  token_rewards = core.outcome_token_rewards(rewards, mask)
  values = jnp.where(mask > 0, 0.5, 0.0)
  gae_adv, _ = core.gae(token_rewards, values, mask, gamma=1.0, lam=0.95)
  last = int(np.asarray(core.last_valid_index(mask))[0])
  say(_row("  A_t, row 0, last 4 tokens",
           np.asarray(gae_adv)[0, last - 3:last + 1]))
  say("```")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
