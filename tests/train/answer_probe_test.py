"""The answer probe equals a naive forward pass per turn boundary."""

import jax
import numpy as np

from rl_rewards import models
from rl_rewards.train import answer_probe

VOCAB = 13
CFG = models.preset("test", VOCAB)
S = 3  # Turn slots; K = S + 1 boundaries.

# Three rows, prompt width 3 (left-padded), then the episode, then padding.
# Step ids: turn k on policy tokens, −1 on prompt, observations, padding.
STEP_IDS = np.array([
    [-1, -1, -1, 0, 0, -1, -1, 1, 1, 1, -1, 2, -1],   # 3 turns, 2 obs
    [-1, -1, -1, 0, 0, 0, -1, 1, 1, -1, -1, -1, -1],  # 2 turns
    [-1, -1, -1, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1],  # 1 turn
], np.int32)
ATTENTION = np.array([
    [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
    [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
], np.int32)
ANSWERS = np.array([[5, 6, 7], [8, 9, 0], [4, 0, 0]], np.int32)
ANSWER_MASK = (np.arange(3)[None, :] < np.array([3, 2, 1])[:, None]).astype(
    np.int32)


def _tokens(seed=0):
  rng = np.random.default_rng(seed)
  return np.where(ATTENTION > 0, rng.integers(3, VOCAB, ATTENTION.shape),
                  0).astype(np.int32)


def _naive(params, tokens):
  """Per row and boundary: the unpadded prefix + answer, full logits (the
  sequences right-padded to one width: causal, so padding after a token
  cannot change its logits)."""
  b, t = tokens.shape
  seqs, spans = [], []
  for row in range(b):
    end = max(i + 1 for i in range(t) if ATTENTION[row, i])
    answer = [int(a) for a, m in zip(ANSWERS[row], ANSWER_MASK[row]) if m]
    for j in range(S + 1):
      starts = [i for i in range(t) if STEP_IDS[row, i] == j]
      cut = starts[0] if starts else end
      prefix = [int(tokens[row, i]) for i in range(cut) if ATTENTION[row, i]]
      seqs.append(prefix + answer)
      spans.append((len(prefix), answer))
  width = max(len(seq) for seq in seqs)
  padded = np.array([seq + [0] * (width - len(seq)) for seq in seqs],
                    np.int32)
  logp = np.asarray(jax.nn.log_softmax(models.logits(CFG, params, padded),
                                       axis=-1))
  total = np.array([sum(float(logp[i, start + k - 1, a])
                        for k, a in enumerate(answer))
                    for i, (start, answer) in enumerate(spans)])
  lengths = np.array([len(answer) for _, answer in spans])
  return (total / lengths).reshape(b, S + 1), total.reshape(b, S + 1)


def test_cuts_are_turn_starts_then_the_row_end():
  cuts = answer_probe.boundary_cuts(STEP_IDS, ATTENTION, S + 1)
  np.testing.assert_array_equal(cuts, [[3, 7, 11, 12], [3, 7, 9, 9],
                                       [3, 5, 5, 5]])


def test_probe_equals_a_forward_pass_per_boundary():
  params = models.init_params(CFG, jax.random.key(0))
  tokens = _tokens()
  want_mean, want_total = _naive(params, tokens)
  # B = 3 probe rows at a time (0); 5 (the 12 padded to 15).
  for rows in (0, 5):
    probe = answer_probe.make_answer_probe(CFG, num_boundaries=S + 1,
                                           micro_batch_size=rows,
                                           chunk_size=4)
    mean, total = probe(params, tokens, ATTENTION, STEP_IDS, ANSWERS,
                        ANSWER_MASK)
    np.testing.assert_allclose(total, want_total, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-4, atol=1e-5)
  # Only the pairs before each row's last turn (row 0: j < 3, row 1: j <
  # 2, row 2: j < 1; 6 pairs, 2 padding ones): the same entries, 0
  # elsewhere.
  read = np.arange(S + 1)[None, :] < np.array([3, 2, 1])[:, None]
  np.testing.assert_array_equal(
      answer_probe.read_pairs(STEP_IDS, S + 1), read)
  some_mean, some_total = probe(params, tokens, ATTENTION, STEP_IDS,
                                ANSWERS, ANSWER_MASK, num_rows=8)
  np.testing.assert_allclose(some_total, np.where(read, total, 0.0),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(some_mean, np.where(read, mean, 0.0),
                             rtol=1e-5, atol=1e-6)
  # The mean divides by the answer's own length: 3, 2, 1 tokens.
  np.testing.assert_allclose(np.asarray(total)[0], 3 * np.asarray(mean)[0],
                             rtol=1e-5)
  assert not np.allclose(np.asarray(total)[0], np.asarray(mean)[0])


def test_observations_are_part_of_the_next_prefix():
  # Changing the observation after turn 0 of row 0 (positions 5, 6) moves
  # every prefix that holds it (j = 1: before turn 1 starts, and on), not
  # j = 0 nor the other rows.
  params = models.init_params(CFG, jax.random.key(1))
  probe = answer_probe.make_answer_probe(CFG, num_boundaries=S + 1)
  tokens = _tokens()
  other = tokens.copy()
  other[0, 5:7] = (tokens[0, 5:7] - 3 + 1) % (VOCAB - 3) + 3
  _, before = probe(params, tokens, ATTENTION, STEP_IDS, ANSWERS,
                    ANSWER_MASK)
  _, after = probe(params, other, ATTENTION, STEP_IDS, ANSWERS, ANSWER_MASK)
  before, after = np.asarray(before), np.asarray(after)
  np.testing.assert_allclose(before[0, :1], after[0, :1], atol=1e-6)
  assert np.all(np.abs(before[0, 1:] - after[0, 1:]) > 1e-6)
  np.testing.assert_allclose(before[1:], after[1:], atol=1e-6)
