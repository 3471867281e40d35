"""Tokenizers and fixed-shape batch encoding.

Two tokenizers share one small interface (`encode`, `decode`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id`, `delimiter_mask`, `format_prompt`):

* `CharTokenizer`: one id per character of a fixed alphabet, after the three
  special ids PAD=0, BOS=1, EOS=2. Serves the embedded arithmetic task.
* `HFTokenizer`: a Hugging Face `tokenizer.json`, loaded with the `tokenizers`
  library (no hub access needed).

Batch layout (shared by SFT and the sampler, so both see identical
positions):

  [PAD ... PAD BOS prompt][response EOS PAD ... PAD]
  |<---- max_prompt_len --->|<--- max_len - max_prompt_len --->|

The prompt is left-padded to `max_prompt_len`; the response starts at column
`max_prompt_len` and is right-padded. Masks are int32 0/1 arrays.
"""

import json
import os
from typing import Optional, Protocol, Sequence

import numpy as np

from rl_rewards import errors

ARITH_ALPHABET = "0123456789+-=\n#"
PLAIN_PROMPT = "{question}"


class Tokenizer(Protocol):
  """The interface the rest of the code relies on."""

  vocab_size: int
  pad_id: int
  bos_id: Optional[int]
  eos_id: int

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids) -> str:
    ...

  def delimiter_mask(self, delimiter: str = "\n") -> np.ndarray:
    ...

  def format_prompt(self, question: str) -> str:
    ...


def _check_prompt_template(template: str) -> None:
  if not isinstance(template, str) or "{question}" not in template:
    raise ValueError(
        "prompt_template must be a string containing '{question}', got "
        f"{template!r}.")


def _to_int_list(ids) -> list[int]:
  if isinstance(ids, np.ndarray):
    if ids.ndim != 1:
      raise ValueError(f"decode expects a 1-D id sequence, got {ids.shape}.")
    return ids.tolist()
  if hasattr(ids, "tolist"):  # jax arrays.
    return np.asarray(ids).tolist()
  return list(ids)


class CharTokenizer:
  """Character-level tokenizer: PAD=0, BOS=1, EOS=2, then the alphabet.

  Attributes:
    alphabet: the characters, in id order starting at id 3.
    vocab_size: 3 + len(alphabet).
    pad_id, bos_id, eos_id: 0, 1, 2.
    prompt_template: format string with "{question}" used by `format_prompt`.
  """

  pad_id = 0
  bos_id = 1
  eos_id = 2
  num_special = 3

  def __init__(self, alphabet: str = ARITH_ALPHABET,
               prompt_template: str = PLAIN_PROMPT):
    if not isinstance(alphabet, str) or not alphabet:
      raise ValueError(
          f"alphabet must be a non-empty string, got {alphabet!r}.")
    duplicates = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if duplicates:
      raise ValueError(
          f"alphabet has repeated characters {duplicates!r}: {alphabet!r}.")
    _check_prompt_template(prompt_template)
    self.alphabet = alphabet
    self.prompt_template = prompt_template
    self.vocab_size = self.num_special + len(alphabet)
    self._char_to_id = {c: i + self.num_special for i, c in enumerate(alphabet)}
    self._id_to_char = ["", "", ""] + list(alphabet)

  def encode(self, text: str) -> list[int]:
    """Ids of the characters of `text` (no BOS/EOS added)."""
    char_to_id = self._char_to_id
    try:
      return [char_to_id[c] for c in text]
    except KeyError:
      for position, char in enumerate(text):
        if char not in char_to_id:
          raise ValueError(
              f"character {char!r} at position {position} of {text[:80]!r} "
              f"is not in the tokenizer alphabet {self.alphabet!r}.") from None
      raise

  def decode(self, ids, errors: str = "strict") -> str:
    """Text of `ids`: stops at the first EOS, skips PAD and BOS.

    Args:
      ids: a 1-D sequence of ids (list, numpy or jax array).
      errors: "strict" raises ValueError on an id outside the vocabulary;
        "replace" writes U+FFFD for it (useful for sampled ids when the model
        vocabulary is padded beyond `vocab_size`).

    Returns:
      The decoded text.
    """
    table = self._id_to_char
    ids = _to_int_list(ids)
    try:
      end = ids.index(self.eos_id)
      ids = ids[:end]
    except ValueError:
      pass
    out = []
    for position, i in enumerate(ids):
      if 0 <= i < self.vocab_size:
        out.append(table[i])
      elif errors == "replace":
        out.append("\ufffd")
      else:
        raise ValueError(
            f"token id {i} at position {position} is outside the vocabulary "
            f"[0, {self.vocab_size}).")
    return "".join(out)

  def delimiter_mask(self, delimiter: str = "\n") -> np.ndarray:
    """bool [vocab_size]: True for tokens whose text ends with `delimiter`.

    With one character per token, only a one-character delimiter can end a
    token, so longer delimiters are rejected.
    """
    if not isinstance(delimiter, str) or len(delimiter) != 1:
      raise ValueError(
          "CharTokenizer supports single-character step delimiters only, got "
          f"{delimiter!r}.")
    if delimiter not in self._char_to_id:
      raise ValueError(
          f"delimiter {delimiter!r} is not in the alphabet {self.alphabet!r}.")
    mask = np.zeros((self.vocab_size,), dtype=bool)
    mask[self._char_to_id[delimiter]] = True
    return mask

  def format_prompt(self, question: str) -> str:
    return self.prompt_template.replace("{question}", question)


_EOS_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>", "[SEP]",
                   "<|end_of_text|>", "<|eot_id|>")
_BOS_CANDIDATES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>",
                   "[CLS]")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|endoftext|>")


class HFTokenizer:
  """A Hugging Face `tokenizer.json` behind the `CharTokenizer` interface.

  Special tokens are resolved in this order: the token strings given to the
  constructor; `tokenizer_config.json` next to the file (keys `bos_token`,
  `eos_token`, `pad_token`); common names present in the vocabulary. EOS is
  required; BOS may be absent (Qwen-style models have none), then prompts get
  no BOS; PAD falls back to EOS.

  Attributes:
    vocab_size: size of the vocabulary including added tokens.
    pad_id, bos_id (or None), eos_id.
    prompt_template: format string with "{question}", e.g. a chat template
      "<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n".
  """

  def __init__(self, path: str, *,
               bos_token: Optional[str] = None,
               eos_token: Optional[str] = None,
               pad_token: Optional[str] = None,
               prompt_template: str = PLAIN_PROMPT):
    import tokenizers  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise ValueError(f"tokenizer file not found: {path}")
    _check_prompt_template(prompt_template)
    self.path = path
    self.prompt_template = prompt_template
    self._tok = tokenizers.Tokenizer.from_file(path)
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    file_config = self._read_tokenizer_config(path)
    self.eos_id = self._resolve("eos", eos_token, file_config, _EOS_CANDIDATES)
    if self.eos_id is None:
      raise ValueError(
          f"{path}: no EOS token found; pass eos_token= (tried "
          f"tokenizer_config.json and {_EOS_CANDIDATES}).")
    self.bos_id = self._resolve("bos", bos_token, file_config,
                                _BOS_CANDIDATES)
    pad_id = self._resolve("pad", pad_token, file_config, _PAD_CANDIDATES)
    self.pad_id = self.eos_id if pad_id is None else pad_id
    self._delimiter_masks = {}

  @staticmethod
  def _read_tokenizer_config(path: str) -> dict:
    config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if not os.path.isfile(config_path):
      return {}
    with open(config_path, encoding="utf-8") as f:
      try:
        config = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{config_path}: invalid JSON ({e}).") from None
    out = {}
    for key in ("bos", "eos", "pad"):
      value = config.get(f"{key}_token")
      if isinstance(value, dict):  # {"content": "<s>", ...} form.
        value = value.get("content")
      if isinstance(value, str):
        out[key] = value
    return out

  def _resolve(self, kind, given, file_config, candidates) -> Optional[int]:
    if given is not None:
      token_id = self._tok.token_to_id(given)
      if token_id is None:
        raise ValueError(
            f"{self.path}: {kind}_token {given!r} is not in the vocabulary.")
      return token_id
    if kind in file_config:
      token_id = self._tok.token_to_id(file_config[kind])
      if token_id is not None:
        return token_id
    for name in candidates:
      token_id = self._tok.token_to_id(name)
      if token_id is not None:
        return token_id
    return None

  def encode(self, text: str) -> list[int]:
    """Ids of `text` without any added special tokens."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids, errors: str = "strict") -> str:
    """Text of `ids`: stops at the first EOS, skips PAD, BOS and special tokens.

    Args:
      ids: a 1-D sequence of ids (list, numpy or jax array).
      errors: "strict" raises ValueError on an id outside the vocabulary;
        "replace" drops it.

    Returns:
      The decoded text.
    """
    ids = _to_int_list(ids)
    try:
      ids = ids[:ids.index(self.eos_id)]
    except ValueError:
      pass
    bad = [(p, i) for p, i in enumerate(ids) if not 0 <= i < self.vocab_size]
    if bad:
      if errors != "replace":
        position, i = bad[0]
        raise ValueError(
            f"token id {i} at position {position} is outside the vocabulary "
            f"[0, {self.vocab_size}).")
      bad_positions = {p for p, _ in bad}
      ids = [i for p, i in enumerate(ids) if p not in bad_positions]
    skip = {self.pad_id, self.bos_id}
    ids = [i for i in ids if i not in skip]
    return self._tok.decode(ids, skip_special_tokens=True)

  def delimiter_mask(self, delimiter: str = "\n") -> np.ndarray:
    """bool [vocab_size]: tokens whose decoded text contains `delimiter`."""
    if not isinstance(delimiter, str) or not delimiter:
      raise ValueError(
          f"delimiter must be a non-empty string, got {delimiter!r}.")
    if delimiter not in self._delimiter_masks:
      texts = self._tok.decode_batch([[i] for i in range(self.vocab_size)],
                                     skip_special_tokens=False)
      self._delimiter_masks[delimiter] = np.array(
          [delimiter in t for t in texts], dtype=bool)
    return self._delimiter_masks[delimiter].copy()

  def format_prompt(self, question: str) -> str:
    return self.prompt_template.replace("{question}", question)


def _prompt_ids(tokenizer, question: str) -> list[int]:
  ids = tokenizer.encode(tokenizer.format_prompt(question))
  if tokenizer.bos_id is not None:
    ids = [tokenizer.bos_id] + ids
  return ids


def encode_prompts(tokenizer: Tokenizer, questions: Sequence[str],
                   max_prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded prompt batch: BOS + formatted question, PAD on the left.

  Args:
    tokenizer: a `CharTokenizer` or `HFTokenizer`.
    questions: B question strings (formatted with the tokenizer's template).
    max_prompt_len: P, the prompt width.

  Returns:
    (tokens int32 [B, P], mask int32 [B, P]) with mask 1 on BOS and prompt.

  Raises:
    ValueError: if a prompt is longer than `max_prompt_len` (never truncated).
  """
  if max_prompt_len < 1:
    raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}.")
  batch = len(questions)
  tokens = np.full((batch, max_prompt_len), tokenizer.pad_id, dtype=np.int32)
  mask = np.zeros((batch, max_prompt_len), dtype=np.int32)
  for b, question in enumerate(questions):
    ids = _prompt_ids(tokenizer, question)
    if len(ids) > max_prompt_len:
      raise errors.InputError(
          f"prompt {b} has {len(ids)} tokens (including BOS), more than "
          f"max_prompt_len={max_prompt_len}: {question[:80]!r}.")
    if ids:
      tokens[b, max_prompt_len - len(ids):] = ids
      mask[b, max_prompt_len - len(ids):] = 1
  return tokens, mask


def encode_sft_batch(tokenizer: Tokenizer, prompts: Sequence[str],
                     targets: Sequence[str], *, max_prompt_len: int,
                     max_len: int) -> dict[str, np.ndarray]:
  """SFT batch in the sampler's layout (see the module docstring).

  Args:
    tokenizer: a `CharTokenizer` or `HFTokenizer`.
    prompts: B questions (formatted with the tokenizer's template).
    targets: B target responses; EOS is appended.
    max_prompt_len: P, the left-padded prompt width.
    max_len: T, the total width; responses get T - P columns.

  Returns:
    dict with int32 [B, T] arrays `tokens`, `loss_mask` (1 on target tokens
    including EOS), `attention_mask` (1 on prompt, target and EOS).

  Raises:
    ValueError: on mismatched lengths, a prompt longer than P or a target
      (with EOS) longer than T - P.
  """
  if len(prompts) != len(targets):
    raise ValueError(
        f"got {len(prompts)} prompts but {len(targets)} targets.")
  if max_len <= max_prompt_len:
    raise ValueError(
        f"max_len ({max_len}) must exceed max_prompt_len ({max_prompt_len}).")
  prompt_tokens, prompt_mask = encode_prompts(tokenizer, prompts,
                                              max_prompt_len)
  batch = len(prompts)
  response_len = max_len - max_prompt_len
  tokens = np.full((batch, max_len), tokenizer.pad_id, dtype=np.int32)
  loss_mask = np.zeros((batch, max_len), dtype=np.int32)
  tokens[:, :max_prompt_len] = prompt_tokens
  for b, target in enumerate(targets):
    ids = tokenizer.encode(target) + [tokenizer.eos_id]
    if len(ids) > response_len:
      raise ValueError(
          f"target {b} has {len(ids)} tokens (including EOS), more than "
          f"max_len - max_prompt_len = {response_len}: {target[:80]!r}.")
    tokens[b, max_prompt_len:max_prompt_len + len(ids)] = ids
    loss_mask[b, max_prompt_len:max_prompt_len + len(ids)] = 1
  attention_mask = loss_mask.copy()
  attention_mask[:, :max_prompt_len] = prompt_mask
  return {"tokens": tokens, "loss_mask": loss_mask,
          "attention_mask": attention_mask}
