"""The answer probe: log π(ground-truth answer | each turn prefix of a row).

For a rollout row b with turns (or steps) 0 … K_b − 1 and a reference
answer a* = (a*_1, …, a*_L) (the text the policy writes as its final
answer, e.g. "#015\\n"), the probe appends a* after every turn boundary j
and scores it with one forward pass of the policy:

  prefix_{b,0} = the prompt (everything before turn 0),
  prefix_{b,j} = everything before turn j starts (turn j − 1's tokens and
                 the observation after it), j = 1 … S; past the row's last
                 turn, the whole row,
  sum_{b,j}    = Σ_t log π(a*_t | prefix_{b,j}, a*_<t),
  mean_{b,j}   = sum_{b,j} / L_b        (L_b the answer's tokens).

IGPO reads exp(mean) (the geometric-mean probability of the answer, its
P_j); exp(sum) is the exact probability that the policy, sampling at
temperature 1, writes the answer right after the prefix (MRT's forced-answer
J_j).

Layout: the batch's right-padded rows [B, T] (a left-padded prompt, then the
response; `step_ids` [B, T] the turn of each policy token, −1 elsewhere).
The probe builds one row of width T + L per (row, boundary) pair in JAX —
row (b, j) holds tokens[b, :c_{b,j}], then a*, then padding, c_{b,j} the
first position of turn j (the row's end when turn j does not exist): all
B·(S+1) pairs, or only those before each row's last turn (`read_pairs`,
`num_rows`) — and runs the model on them `micro_batch_size` rows at a time
(`microbatch.map_rows`; B when 0), with the LM head in chunks
(`models.token_logprobs`). Simple, not fast: every prefix is recomputed (a
KV-cache version would share them).
"""

import jax
import jax.numpy as jnp

from rl_rewards import models
from rl_rewards.train import microbatch


def boundary_cuts(step_ids, attention_mask, num_boundaries: int):
  """[B, K] c_{b,j}: the first position of turn j, else the row's end.

  Args:
    step_ids: [B, T] int turn of each policy token, −1 elsewhere.
    attention_mask: [B, T] 1 on real tokens (prompt, turns, observations).
    num_boundaries: K = S + 1.

  Returns:
    [B, K] int32 cut positions: prefix j is the tokens at positions < c.
  """
  t = step_ids.shape[1]
  pos = jnp.arange(t, dtype=jnp.int32)
  end = jnp.max(jnp.where(attention_mask > 0, pos[None, :] + 1, 0), axis=1)
  turns = jnp.arange(num_boundaries, dtype=jnp.int32)
  hit = step_ids[:, None, :] == turns[None, :, None]            # [B, K, T]
  first = jnp.min(jnp.where(hit, pos[None, None, :], t), axis=2)
  return jnp.where(jnp.any(hit, axis=2), first, end[:, None]).astype(
      jnp.int32)


def probe_rows(tokens, attention_mask, cuts, answer_tokens, answer_mask, *,
               pad_id: int = 0):
  """The probe's rows: prefix, answer, padding.

  Args:
    tokens, attention_mask: [B, T] the rollout rows.
    cuts: [B, K] prefix ends (`boundary_cuts`).
    answer_tokens, answer_mask: [B, L] the answer of each row, its valid
      tokens first.
    pad_id: the padding id.

  Returns:
    (tokens [B, K, T+L], attention_mask [B, K, T+L], scored [B, K, T+L]:
    1 on the answer's valid tokens).
  """
  b, t = tokens.shape
  length = answer_tokens.shape[1]
  pos = jnp.arange(t + length, dtype=jnp.int32)[None, None, :]
  cut = cuts[:, :, None]
  in_prefix = pos < cut
  rel = pos - cut
  in_answer = (rel >= 0) & (rel < length)
  src = jnp.clip(jnp.arange(t + length), 0, t - 1)
  prefix_tok = jnp.broadcast_to(tokens[:, src][:, None, :], in_prefix.shape)
  prefix_att = jnp.broadcast_to(attention_mask[:, src][:, None, :],
                                in_prefix.shape)
  idx = jnp.clip(rel, 0, length - 1)
  answer_tok = jnp.take_along_axis(
      jnp.broadcast_to(answer_tokens[:, None, :], (b, cuts.shape[1], length)),
      idx, axis=2)
  answer_ok = jnp.take_along_axis(
      jnp.broadcast_to(answer_mask[:, None, :], (b, cuts.shape[1], length)),
      idx, axis=2) > 0
  scored = in_answer & answer_ok
  out_tok = jnp.where(in_prefix, prefix_tok,
                      jnp.where(scored, answer_tok, pad_id))
  out_att = jnp.where(in_prefix, prefix_att, scored.astype(jnp.int32))
  return (out_tok.astype(jnp.int32), out_att.astype(jnp.int32),
          scored.astype(jnp.float32))


def read_pairs(step_ids, num_boundaries: int):
  """[B, K] the boundaries a caller reads: j < max(K_b, 1), K_b the row's
  turns (IGPO and MRT read no boundary after a row's last turn: that turn
  gets the outcome reward)."""
  turns = jnp.max(step_ids, axis=1) + 1
  return (jnp.arange(num_boundaries)[None, :] <
          jnp.maximum(turns, 1)[:, None])


def make_answer_probe(model_config: models.ModelConfig, *, num_boundaries: int,
                      micro_batch_size: int = 0,
                      chunk_size: int = models.DEFAULT_LOGITS_CHUNK,
                      pad_id: int = 0):
  """`(params, tokens, attention_mask, step_ids, answer_tokens, answer_mask,
  num_rows=None) -> (mean [B, K], sum [B, K])` answer log-probs after
  boundaries 0 … K − 1 (module docstring), K = `num_boundaries`, jitted.

  `num_rows` (static) None scores all B·K (row, boundary) pairs; N scores
  only the pairs `read_pairs` marks (their first N in row-major order: N at
  least their count, e.g. it rounded up to a power of two, one compile per
  N) and leaves the other entries 0. Episodes of a few turns then cost a few
  prefixes each, not K.

  The model runs on `micro_batch_size` probe rows at a time; 0 runs B at a
  time, as many as a pass over the rollout itself (not all B·K at once: K
  times the memory).
  """
  k = num_boundaries

  def probe(params, tokens, attention_mask, step_ids, answer_tokens,
            answer_mask, num_rows=None):
    b = tokens.shape[0]
    cuts = boundary_cuts(step_ids, attention_mask, k)
    if num_rows is None:
      idx = jnp.arange(b * k)
      real = jnp.ones((b * k,), bool)
    else:
      read = read_pairs(step_ids, k).reshape(-1)
      (idx,) = jnp.nonzero(read, size=num_rows, fill_value=0)
      real = jnp.arange(num_rows) < jnp.sum(read)
    row, boundary = idx // k, idx % k
    seq, att, scored = probe_rows(
        tokens[row], attention_mask[row], cuts[row, boundary][:, None],
        answer_tokens[row], answer_mask[row], pad_id=pad_id)
    logp = microbatch.map_rows(
        lambda rows: models.token_logprobs(
            model_config, params, rows["tokens"], rows["attention_mask"],
            chunk_size=chunk_size),
        {"tokens": seq[:, 0], "attention_mask": att[:, 0]},
        micro_batch_size or b)
    total = jnp.sum(logp * scored[:, 0], axis=1)
    mean = total / jnp.maximum(jnp.sum(scored[:, 0], axis=1), 1.0)
    where = jnp.where(real, idx, b * k)  # Padding pairs are dropped.

    def scatter(values):
      return jnp.zeros((b * k,), values.dtype).at[where].set(
          values, mode="drop").reshape(b, k)

    return scatter(mean), scatter(total)

  return jax.jit(probe, static_argnames=("num_rows",))
