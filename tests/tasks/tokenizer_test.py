"""Tests for rl_rewards.tasks.tokenizer."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers

from rl_rewards.tasks import tokenizer as tokenizer_lib


def _write_bpe_tokenizer(directory, special_tokens=("<|endoftext|>",
                                                    "<|im_start|>",
                                                    "<|im_end|>")):
  """Trains a tiny byte-level BPE on a few strings; returns the file path."""
  tok = tokenizers.Tokenizer(models.BPE())
  # No regex split, so merges can span "\n\n" (tokens like ".\n\n").
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                               use_regex=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=330, special_tokens=list(special_tokens),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False)
  corpus = ["Compute 12+7.\n\nFirst, 12+7=19.\n\nThe answer is 19.",
            "user\nWhat is 3 times 4?\nassistant\n12\n"] * 20
  tok.train_from_iterator(corpus, trainer)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  return path


class CharTokenizerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.CharTokenizer()

  def test_ids(self):
    # PAD BOS EOS, then "0123456789+-=\n#" from id 3.
    self.assertEqual(self.tok.vocab_size, 18)
    self.assertEqual((self.tok.pad_id, self.tok.bos_id, self.tok.eos_id),
                     (0, 1, 2))
    self.assertEqual(self.tok.encode("09+-=\n#"), [3, 12, 13, 14, 15, 16, 17])

  def test_encode_rejects_unknown_character_with_position(self):
    with self.assertRaisesRegex(ValueError, r"'x' at position 3"):
      self.tok.encode("12+x")

  def test_decode_stops_at_eos_and_skips_pad_bos(self):
    ids = [0, 0, 1] + self.tok.encode("1+2=3") + [2] + self.tok.encode("99")
    self.assertEqual(self.tok.decode(ids), "1+2=3")
    self.assertEqual(self.tok.decode(np.array(ids, np.int32)), "1+2=3")

  def test_decode_out_of_vocab(self):
    with self.assertRaisesRegex(ValueError, "token id 40 at position 1"):
      self.tok.decode([3, 40])
    self.assertEqual(self.tok.decode([3, 40, 4], errors="replace"),
                     "0\ufffd1")

  def test_round_trip(self):
    text = "023+07=030\n030-15=015\n#015"
    self.assertEqual(self.tok.decode(self.tok.encode(text)), text)

  def test_delimiter_mask(self):
    mask = self.tok.delimiter_mask("\n")
    self.assertEqual(mask.shape, (18,))
    self.assertEqual(np.flatnonzero(mask).tolist(), [16])
    with self.assertRaisesRegex(ValueError, "single-character"):
      self.tok.delimiter_mask("\n\n")
    with self.assertRaisesRegex(ValueError, "not in the alphabet"):
      self.tok.delimiter_mask("x")

  def test_bad_alphabet(self):
    with self.assertRaisesRegex(ValueError, "repeated"):
      tokenizer_lib.CharTokenizer("0120")


class EncodeBatchTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.CharTokenizer()

  def test_encode_prompts_left_padded(self):
    tokens, mask = tokenizer_lib.encode_prompts(self.tok, ["1=", "12+3="], 7)
    # "1=" -> BOS 4 15 right-aligned in 7 columns.
    np.testing.assert_array_equal(tokens, [[0, 0, 0, 0, 1, 4, 15],
                                           [0, 1, 4, 5, 13, 6, 15]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 0, 1, 1, 1],
                                         [0, 1, 1, 1, 1, 1, 1]])
    self.assertEqual(tokens.dtype, np.int32)

  def test_prompt_too_long_names_example(self):
    with self.assertRaisesRegex(ValueError,
                                r"prompt 1 has 6 tokens.*max_prompt_len=5"):
      tokenizer_lib.encode_prompts(self.tok, ["1=", "12+3="], 5)

  def test_sft_batch_layout(self):
    batch = tokenizer_lib.encode_sft_batch(
        self.tok, ["1=", "2="], ["#1", "#22"], max_prompt_len=4, max_len=9)
    # Row 0: PAD BOS '1' '=' | '#' '1' EOS PAD PAD
    np.testing.assert_array_equal(batch["tokens"][0],
                                  [0, 1, 4, 15, 17, 4, 2, 0, 0])
    np.testing.assert_array_equal(batch["loss_mask"][0],
                                  [0, 0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch["attention_mask"][0],
                                  [0, 1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch["tokens"][1],
                                  [0, 1, 5, 15, 17, 5, 5, 2, 0])
    prompts, _ = tokenizer_lib.encode_prompts(self.tok, ["1=", "2="], 4)
    np.testing.assert_array_equal(batch["tokens"][:, :4], prompts)

  def test_sft_target_too_long(self):
    with self.assertRaisesRegex(ValueError, r"target 0 has 4 tokens"):
      tokenizer_lib.encode_sft_batch(self.tok, ["1="], ["#12"],
                                     max_prompt_len=4, max_len=7)


class HFTokenizerTest(absltest.TestCase):

  def _make_tempdir(self):
    directory = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
    return directory

  def setUp(self):
    super().setUp()
    self.dir = self._make_tempdir()
    self.path = _write_bpe_tokenizer(self.dir)

  def test_special_ids_and_round_trip(self):
    tok = tokenizer_lib.HFTokenizer(self.path)
    raw = tokenizers.Tokenizer.from_file(self.path)
    self.assertEqual(tok.eos_id, raw.token_to_id("<|endoftext|>"))
    self.assertIsNone(tok.bos_id)
    self.assertEqual(tok.pad_id, tok.eos_id)
    text = "First, 12+7=19.\n\nThe answer is 19."
    ids = tok.encode(text)
    self.assertEqual(tok.decode(ids + [tok.eos_id] + ids), text)

  def test_tokens_from_config_file_and_arguments(self):
    with open(os.path.join(self.dir, "tokenizer_config.json"), "w",
              encoding="utf-8") as f:
      json.dump({"eos_token": {"content": "<|im_end|>"},
                 "bos_token": "<|im_start|>"}, f)
    tok = tokenizer_lib.HFTokenizer(self.path)
    raw = tokenizers.Tokenizer.from_file(self.path)
    self.assertEqual(tok.eos_id, raw.token_to_id("<|im_end|>"))
    self.assertEqual(tok.bos_id, raw.token_to_id("<|im_start|>"))
    tok = tokenizer_lib.HFTokenizer(self.path, eos_token="<|endoftext|>")
    self.assertEqual(tok.eos_id, raw.token_to_id("<|endoftext|>"))
    with self.assertRaisesRegex(ValueError, "'<nope>' is not in the vocab"):
      tokenizer_lib.HFTokenizer(self.path, pad_token="<nope>")

  def test_missing_eos(self):
    directory = self._make_tempdir()
    path = _write_bpe_tokenizer(directory, special_tokens=("<unk>",))
    with self.assertRaisesRegex(ValueError, "no EOS token"):
      tokenizer_lib.HFTokenizer(path)

  def test_delimiter_mask_is_every_token_containing_delimiter(self):
    tok = tokenizer_lib.HFTokenizer(self.path)
    raw = tokenizers.Tokenizer.from_file(self.path)
    for delimiter in ("\n", "\n\n"):
      mask = tok.delimiter_mask(delimiter)
      self.assertEqual(mask.shape, (tok.vocab_size,))
      expected = [delimiter in raw.decode([i]) for i in range(tok.vocab_size)]
      np.testing.assert_array_equal(mask, expected)
      self.assertTrue(mask.any())
    # Every "\n\n" token also contains "\n".
    self.assertTrue(np.all(tok.delimiter_mask("\n")[
        tok.delimiter_mask("\n\n")]))

  def test_stop_ids_from_generation_config(self):
    raw = tokenizers.Tokenizer.from_file(self.path)
    end, im_end = raw.token_to_id("<|endoftext|>"), raw.token_to_id(
        "<|im_end|>")
    tok = tokenizer_lib.HFTokenizer(self.path)
    self.assertEqual(tok.stop_ids, (end,))
    self.assertEqual(tok.end_of_turn_id, end)
    for eos_token_id, expected in ((im_end, (end, im_end)),
                                   ([im_end, end], (end, im_end))):
      with open(os.path.join(self.dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos_token_id, "pad_token_id": end}, f)
      tok = tokenizer_lib.HFTokenizer(self.path)
      self.assertEqual(tok.stop_ids, expected)
    # Decoding stops at any of them.
    ids = tok.encode("12+7=19.")
    self.assertEqual(tok.decode(ids + [im_end] + ids), "12+7=19.")
    with open(os.path.join(self.dir, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": [end, 10**6]}, f)
    with self.assertRaisesRegex(ValueError, "generation_config.json: eos_t"):
      tokenizer_lib.HFTokenizer(self.path)

  def test_delimiter_mask_padded_to_the_model_vocabulary(self):
    tok = tokenizer_lib.HFTokenizer(self.path)
    mask = tok.delimiter_mask("\n", tok.vocab_size + 6)
    self.assertEqual(mask.shape, (tok.vocab_size + 6,))
    np.testing.assert_array_equal(mask[:tok.vocab_size],
                                  tok.delimiter_mask("\n"))
    self.assertFalse(mask[tok.vocab_size:].any())
    with self.assertRaisesRegex(ValueError, "smaller than"):
      tok.delimiter_mask("\n", tok.vocab_size - 1)
    char = tokenizer_lib.CharTokenizer()
    mask = char.delimiter_mask("\n", 20)
    self.assertEqual(mask.tolist(), char.delimiter_mask("\n").tolist() +
                     [False, False])

  def test_chat_template_prompt(self):
    template = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    tok = tokenizer_lib.HFTokenizer(self.path, prompt_template=template)
    tokens, mask = tokenizer_lib.encode_prompts(tok, ["What is 3 times 4?"],
                                                40)
    ids = tokens[0][mask[0] == 1].tolist()
    raw = tokenizers.Tokenizer.from_file(self.path)
    self.assertEqual(ids[0], raw.token_to_id("<|im_start|>"))
    self.assertEqual(raw.decode(ids, skip_special_tokens=False),
                     template.format(question="What is 3 times 4?"))
    with self.assertRaisesRegex(ValueError, "{question}"):
      tokenizer_lib.HFTokenizer(self.path, prompt_template="no slot")


if __name__ == "__main__":
  absltest.main()
