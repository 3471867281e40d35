"""IGPO: information-gain turn rewards (Wang et al., arXiv 2510.14967).

Each turn of an episode is paid by how much it raised the policy's
probability of the ground-truth answer a* (the task's answer turn, e.g.
"#015\\n"), read by appending a* after every turn boundary (the answer
probe, `train/answer_probe.py`, one forward pass of π_old per boundary):

  P_{b,j}  = exp(mean_t log π(a*_t | prefix_{b,j}, a*_<t))
             (prefix_{b,0} the prompt; prefix_{b,j} everything before turn
             j, i.e. turn j − 1 and its observation)
  r_{b,k}  = P_{b,k+1} − P_{b,k}   for turns k < K_b − 1,
  r_{b,K_b−1} = R_b                (the answer turn: the outcome reward)
  r̂       = z-score of r within the prompt's group (`rl.igpo.norm`:
             "joint" pools every turn's reward, "separate" z-scores the
             outcomes and the gains apart; population std, as the code)
  A_{b,k}  = Σ_{j ≥ k} γ^{j−k} r̂_{b,j}   (γ = `rl.igpo.gamma`, default 1)

and A_{b,k} goes on every policy token of turn k (observations are never
trained on). The math is `core.igpo` (its docstring: where the paper and
the released code differ, and what is followed: the code's mean — not sum
— of the answer's log-probs, its std, its γ = 1, its "joint" default;
its training script sets "separate"). `rl.advantage_estimator` is not read.

Signal diagnostics: `outcome` is GRPO's z-score of R_b on every policy
token, `process` what IGPO adds to it; `train/igpo_answer_prob_initial`
and `train/igpo_answer_prob_final` are the mean P after the prompt and
before the answer turn, `train/igpo_gain_mean` the mean r over non-answer
turns.

    python -m experiments.train --config=configs/igpo.py --workdir=runs/igpo
    python -m experiments.train --config=configs/igpo.py:norm=separate \\
        --workdir=runs/igpo_separate
    python -m experiments.train --config=configs/igpo.py:size=test \\
        --workdir=/tmp/igpo                             # a smoke run
"""

import jax.numpy as jnp

from rl_rewards import config_lib
from rl_rewards import core
from rl_rewards.core import igpo as igpo_lib
from rl_rewards.runners import programs
from rl_rewards.runners import tasks as tasks_lib
from rl_rewards.runners.methods import base
from rl_rewards.train import answer_probe

ANSWER_TASKS = ("hidden_operands", "arith")
PROBE = "rl/answer_logprobs"


def probe_pass(config, model_config) -> programs.Pass:
  """The answer probe over each rollout, as a `programs.Pass` of the
  policy: `(params, tokens, attention_mask, step_ids, answer_tokens,
  answer_mask) -> (mean, sum)` [B, S+1] answer log-probs."""
  width = tasks_lib.answer_width(config.task)
  fn = answer_probe.make_answer_probe(
      model_config, num_boundaries=config.task.max_steps + 1,
      micro_batch_size=config_lib.pass_micro_batch_size(config.rl),
      chunk_size=config.model.logits_chunk)
  return programs.Pass(PROBE, "policy", ("lm",), fn,
                       {"step_ids": (jnp.int32, None),
                        "answer_tokens": (jnp.int32, width),
                        "answer_mask": (jnp.int32, width)})


def probe_rows_needed(step_ids, num_steps: int) -> int:
  """N for the probe: the (row, boundary) pairs IGPO and MRT read
  (`answer_probe.read_pairs`: boundaries 0 … K_b − 1 of each row) rounded
  up to a power of two (few compiles), at most B·(S+1)."""
  pairs = int(jnp.sum(answer_probe.read_pairs(step_ids, num_steps + 1)))
  return min(1 << max(pairs - 1, 0).bit_length(),
             step_ids.shape[0] * (num_steps + 1))


def run_probe(fns, state, batch, num_steps: int):
  """(mean, sum) [B, S+1] answer log-probs of the rollout under π_old.

  Only the boundaries a row's turns read are computed (`probe_rows_needed`);
  the entries after a row's last turn (never read) are 0.
  """
  return fns[PROBE](state["policy"].params, batch["tokens"],
                    batch["attention_mask"], batch["step_ids"],
                    batch["answer_tokens"], batch["answer_mask"],
                    num_rows=probe_rows_needed(batch["step_ids"], num_steps))


def check_answer_task(config, method: str):
  base.require(config.task.name in ANSWER_TASKS, "task.name",
               f"{method} reads the true answer's probability after each "
               f"prefix, which needs the task's answer text: one of "
               f"{ANSWER_TASKS}, got {config.task.name!r}.")


class IGPO(base.Method):
  """`rl.method="igpo"`."""

  reads_answers = True

  def check(self):
    check_answer_task(self.config, "IGPO")

  def programs(self, model_config):
    return (probe_pass(self.config, model_config),)

  def signals(self, ctx, fns, state, batch):
    num_steps = self.config.task.max_steps
    mean, _ = run_probe(fns, state, batch, num_steps)
    turns = core.step_mask_from_ids(batch["step_ids"], num_steps)
    r = igpo_lib.information_gain_rewards(mean, batch["rewards"], turns)
    count = jnp.sum(turns, axis=1)
    p = jnp.exp(mean)
    before_answer = jnp.take_along_axis(
        p, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
    gains = turns & (jnp.arange(num_steps)[None, :] < (count - 1)[:, None])
    record = {
        "train/igpo_answer_prob_initial": float(jnp.mean(p[:, 0])),
        "train/igpo_answer_prob_final": float(jnp.mean(before_answer)),
        "train/igpo_gain_mean": float(jnp.sum(jnp.where(gains, r, 0.0)) /
                                      jnp.maximum(jnp.sum(gains), 1))}
    return state, {"answer_logprobs": mean}, record

  def advantages(self, batch):
    cfg = self.cfg
    turns = core.step_mask_from_ids(batch["step_ids"],
                                    self.config.task.max_steps)
    turn_adv = core.igpo_advantages(
        batch["answer_logprobs"], batch["rewards"], turns, cfg.group_size,
        gamma=cfg.igpo.gamma, norm=cfg.igpo.norm, eps=cfg.advantage_eps)
    mask = batch["response_mask"].astype(jnp.float32)
    a = core.steps_to_tokens(turn_adv, batch["step_ids"]) * mask
    outcome = base.outcome_token_advantages(cfg, batch, "grpo")
    return a, {"outcome": outcome, "process": a - outcome}
