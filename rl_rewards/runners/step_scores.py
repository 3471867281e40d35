"""The step scores the RL stage reads: a trained verifier's or the oracle's.

Methods that read step scores (`Method.reads_step_scores`) find in the
batch `step_scores` [B, S], `q_values` [B, S] and `v_init` [B], from the
verifier the run trained (`rl.prm_source="model"`) or from the task's step
checker (`"oracle"`: ground-truth step labels, which the arith task has,
and per turn the hidden-operands task: a multi-turn episode's turns are its
steps). The step checker's labels also feed the diagnostics that compare a
verifier, or a method's process signal, with the truth
(`rl.log_oracle_agreement`, `runners/rl_metrics.py`).
"""

import numpy as np


def oracle_step_arrays(step_labels, num_steps: int):
  """Ground-truth step labels -> `[B, S]` host arrays.

  Returns:
    dict with `labels` (1.0 correct / 0.0 wrong), `q_values` (Q of a perfect
    prover: 1 until the first wrong step, then 0), `v_init` (ones: a perfect
    prover solves the bare question). Steps beyond `num_steps` are merged
    into the last slot (correct only if all merged steps are).
  """
  batch = len(step_labels)
  labels = np.zeros((batch, num_steps), np.float32)
  for b, row in enumerate(step_labels):
    row = [bool(x) for x in row]
    if len(row) > num_steps:
      row = row[:num_steps - 1] + [all(row[num_steps - 1:])]
    labels[b, :len(row)] = row
  return {"labels": labels, "q_values": np.cumprod(labels, axis=1),
          "v_init": np.ones((batch,), np.float32)}


def step_score_arrays(verifier, batch, oracle, put_rows,
                      verifier_params=None):
  """The verifier's (or oracle's) step signal of a rollout batch.

  Returns `step_scores` [B, S] (P(step correct)), `q_values` [B, S] (Q^π of
  each prefix) and `v_init` [B] (V^π of the question) as device arrays. A
  learned verifier's scores are its Q^π (with `verifier_params`, the
  refreshed verifier's parameters instead of its trained ones); the oracle
  (`verifier` None) gives 0/1 step labels, a perfect prover's Q (1 until
  the first wrong step) and V = 1.

  Args:
    verifier: the method's `Verifier`, or None for the oracle.
    batch: the rollout batch (`tokens`, `attention_mask`, `step_ids`).
    oracle: `oracle_step_arrays` of this process's rows (oracle only).
    put_rows: this process's rows (host) -> a global [B, ...] array.
    verifier_params: the refreshed verifier's parameters, or None.
  """
  if verifier is None:
    return {"step_scores": put_rows(oracle["labels"]),
            "q_values": put_rows(oracle["q_values"]),
            "v_init": put_rows(oracle["v_init"])}
  scores = verifier.scorer.score_rollout(batch["tokens"],
                                         batch["attention_mask"],
                                         batch["step_ids"],
                                         params=verifier_params)
  return {"step_scores": scores["step_scores"],
          "q_values": scores["step_scores"], "v_init": scores["v_init"]}
