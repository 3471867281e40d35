"""Tests for rl_rewards.tasks.segmentation (text and token step rules)."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import numpy as np

from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib

TOK = tokenizer_lib.CharTokenizer()
NL = TOK.encode("\n")[0]
EOS = TOK.eos_id
PAD = TOK.pad_id
DELIM_MASK = TOK.delimiter_mask("\n")


def _reference_step_ids(tokens, response_mask, delimiter_mask, eos_id):
  """Step ids from the definition, one token at a time."""
  out = np.full(tokens.shape, -1, np.int32)
  for b in range(tokens.shape[0]):
    valid = [t for t in range(tokens.shape[1]) if response_mask[b, t]]
    if not valid:
      continue
    last = valid[-1]
    step = 0
    for t in valid:
      out[b, t] = step
      is_delim = delimiter_mask[tokens[b, t]]
      absorbed = (t + 1 == last and tokens[b, last] == eos_id)
      if t == last or (is_delim and not absorbed):
        step += 1
  return out


def _layout(prompt_ids, response_ids, width):
  """One row: prompt, response, right padding; returns (tokens, resp_mask)."""
  row = prompt_ids + response_ids
  tokens = np.full((width,), PAD, np.int32)
  mask = np.zeros((width,), np.int32)
  tokens[:len(row)] = row
  mask[len(prompt_ids):len(row)] = 1
  return tokens, mask


class SplitStepsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("no_delimiter", "abc", ["abc"]),
      ("empty", "", [""]),
      ("only_delimiter", "\n", [""]),
      ("two_steps", "a\nb", ["a", "b"]),
      ("empty_step_kept", "a\n\nb", ["a", "", "b"]),
      ("trailing_delimiter_dropped", "a\nb\n", ["a", "b"]),
      ("trailing_empty_step", "a\n\n", ["a", ""]),
      ("leading_empty_step", "\na", ["", "a"]),
  )
  def test_hand_cases(self, text, expected):
    self.assertEqual(segmentation.split_steps(text), expected)
    self.assertEqual(segmentation.num_text_steps(text), len(expected))

  def test_multi_character_delimiter(self):
    self.assertEqual(segmentation.split_steps("a\n\nb\nc\n\n", "\n\n"),
                     ["a", "b\nc"])

  def test_round_trip(self):
    rng = np.random.default_rng(0)
    for _ in range(300):
      text = "".join(rng.choice(list("ab\n"), size=rng.integers(0, 12)))
      steps = segmentation.split_steps(text)
      self.assertEqual(segmentation.num_text_steps(text), len(steps))
      rejoined = segmentation.join_steps(steps)
      if not text.endswith("\n") or text == "":
        self.assertEqual(rejoined, text)
      else:
        self.assertEqual(rejoined + "\n", text)

  def test_bad_delimiter(self):
    with self.assertRaisesRegex(ValueError, "delimiter"):
      segmentation.split_steps("a", "")


class StepIdsFromTokensTest(parameterized.TestCase):

  def test_hand_computed(self):
    # Prompt "1" (BOS 1 + '1'), response "2\n3\n" + EOS, then padding.
    # Tokens:    BOS '1' | '2' NL '3' NL EOS | PAD
    # Step ends:             -   x   -  .  x        (NL before final EOS joins)
    # Step ids:  -1  -1  |  0   0   1   1   1  | -1
    one, two, three = TOK.encode("123")
    tokens = np.array([[1, one, two, NL, three, NL, EOS, PAD]])
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 0]])
    ends = segmentation.step_ends_from_tokens(tokens, mask, DELIM_MASK,
                                              eos_id=EOS)
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=EOS)
    np.testing.assert_array_equal(ends[0], [0, 0, 0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(ids[0], [-1, -1, 0, 0, 1, 1, 1, -1])
    # Truncated (no EOS, last token a delimiter): the NL ends the final step.
    mask_truncated = np.array([[0, 0, 1, 1, 1, 1, 0, 0]])
    ids = segmentation.step_ids_from_tokens(tokens, mask_truncated,
                                            DELIM_MASK, eos_id=EOS)
    np.testing.assert_array_equal(ids[0], [-1, -1, 0, 0, 1, 1, -1, -1])
    # Without an EOS id, the final EOS forms its own step.
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=None)
    np.testing.assert_array_equal(ids[0], [-1, -1, 0, 0, 1, 1, 2, -1])

  def test_any_of_several_eos_ids_joins_the_last_step(self):
    # Tokens '2' NL X with X an end-of-sequence id: a second stop id (e.g.
    # <|im_end|> next to <|endoftext|>) must join the NL's step as EOS does.
    two, three = TOK.encode("23")
    tokens = np.array([[two, NL, EOS], [two, NL, three], [two, NL, PAD]])
    mask = np.ones_like(tokens)
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=(three, EOS))
    np.testing.assert_array_equal(ids, [[0, 0, 0], [0, 0, 0], [0, 0, 1]])
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=EOS)
    np.testing.assert_array_equal(ids, [[0, 0, 0], [0, 0, 1], [0, 0, 1]])
    self.assertEqual(segmentation.eos_id_tuple([EOS, three, EOS]),
                     (EOS, three))
    self.assertEqual(segmentation.eos_id_tuple(None), ())
    with self.assertRaisesRegex(ValueError, "eos_id"):
      segmentation.eos_id_tuple(["x"])

  def test_all_padding_row_and_single_token(self):
    tokens = np.array([[PAD, PAD, PAD], [PAD, EOS, PAD], [PAD, NL, PAD]])
    mask = np.array([[0, 0, 0], [0, 1, 0], [0, 1, 0]])
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=EOS)
    np.testing.assert_array_equal(
        ids, [[-1, -1, -1], [-1, 0, -1], [-1, 0, -1]])
    counts = segmentation.num_steps_from_tokens(tokens, mask, DELIM_MASK,
                                                eos_id=EOS)
    np.testing.assert_array_equal(counts, [0, 1, 1])

  def test_out_of_vocab_ids_are_not_delimiters(self):
    tokens = np.array([[NL, 99, -3, EOS]])
    mask = np.ones_like(tokens)
    ids = segmentation.step_ids_from_tokens(tokens, mask, DELIM_MASK,
                                            eos_id=EOS)
    np.testing.assert_array_equal(ids[0], [0, 1, 1, 1])

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, r"\[B, T\]"):
      segmentation.step_ids_from_tokens(np.zeros((2, 3), np.int32),
                                        np.zeros((2, 4)), DELIM_MASK,
                                        eos_id=EOS)

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_reference_on_random_batches(self):
    rng = np.random.default_rng(1)
    batch, width = 16, 12
    tokens = rng.choice([NL, 3, 4, 5, EOS], size=(batch, width)).astype(
        np.int32)
    mask = np.zeros((batch, width), np.int32)
    for b in range(batch):
      start = rng.integers(0, width)
      stop = rng.integers(start, width + 1)
      mask[b, start:stop] = 1
    step_ids = self.variant(functools.partial(
        segmentation.step_ids_from_tokens, eos_id=EOS))
    np.testing.assert_array_equal(
        step_ids(tokens, mask, DELIM_MASK),
        _reference_step_ids(tokens, mask, DELIM_MASK, EOS))

  def test_padding_invariance(self):
    rng = np.random.default_rng(2)
    tokens = rng.choice([NL, 3, 4, EOS], size=(4, 9)).astype(np.int32)
    mask = np.ones((4, 9), np.int32)
    mask[:, :2] = 0  # Prompt columns.
    fn = jax.jit(segmentation.step_ids_from_tokens, static_argnames="eos_id")
    base = fn(tokens, mask, DELIM_MASK, eos_id=EOS)
    padded_tokens = np.concatenate(
        [tokens, rng.choice([NL, 3, EOS], size=(4, 5)).astype(np.int32)], 1)
    padded_mask = np.concatenate([mask, np.zeros((4, 5), np.int32)], 1)
    padded = fn(padded_tokens, padded_mask, DELIM_MASK, eos_id=EOS)
    np.testing.assert_array_equal(padded[:, :9], base)
    np.testing.assert_array_equal(padded[:, 9:], -1)


class TextTokenConsistencyTest(parameterized.TestCase):

  @parameterized.named_parameters(("finished", True), ("truncated", False))
  def test_token_steps_match_text_steps(self, finished):
    rng = np.random.default_rng(3 if finished else 4)
    alphabet = list("0123+=#\n\n\n")
    texts = [""] + ["".join(rng.choice(alphabet, size=rng.integers(0, 14)))
                    for _ in range(300)]
    if not finished:  # A truncated response has at least one token.
      texts = [t for t in texts if t]
    width = 3 + 14 + 1 + 2
    rows, masks = [], []
    for text in texts:
      response = TOK.encode(text) + ([EOS] if finished else [])
      row, mask = _layout([PAD, TOK.bos_id, TOK.encode("1")[0]], response,
                          width)
      rows.append(row)
      masks.append(mask)
    tokens, masks = np.stack(rows), np.stack(masks)
    step_ids = np.asarray(jax.jit(
        segmentation.step_ids_from_tokens, static_argnames="eos_id")(
            tokens, masks, DELIM_MASK, eos_id=EOS))
    for b, text in enumerate(texts):
      text_steps = segmentation.split_steps(text)
      num_token_steps = step_ids[b].max() + 1
      self.assertEqual(num_token_steps, len(text_steps), repr(text))
      for k, text_step in enumerate(text_steps):
        step_text = TOK.decode(tokens[b][step_ids[b] == k])
        if step_text.endswith("\n"):
          step_text = step_text[:-1]
        self.assertEqual(step_text, text_step, (repr(text), k))


if __name__ == "__main__":
  absltest.main()
