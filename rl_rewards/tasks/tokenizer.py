"""Tokenizers and fixed-shape batch encoding.

Two tokenizers share one small interface (`encode`, `decode`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id`, `stop_ids`, `end_of_turn_id`, `prepend_bos`,
`delimiter_mask`, `format_prompt`):

* `CharTokenizer`: one id per character of a fixed alphabet, after the three
  special ids PAD=0, BOS=1, EOS=2. Serves the embedded arithmetic task.
* `HFTokenizer`: a Hugging Face `tokenizer.json`, loaded with the `tokenizers`
  library (no hub access needed). With `prompt_template="chat"` prompts are
  rendered with the checkpoint's own Jinja chat template, exactly as
  transformers' `apply_chat_template(..., add_generation_prompt=True)` does.

Ids that end a response: `stop_ids` (the tokenizer's EOS, every id of
generation_config.json's `eos_token_id` and the chat template's end-of-turn
token). SFT targets end with `end_of_turn_id` (the token a chat template
writes after an assistant message, e.g. <|im_end|>; EOS otherwise).

Batch layout (shared by SFT and the sampler, so both see identical
positions):

  [PAD ... PAD BOS prompt][response EOS PAD ... PAD]
  |<---- max_prompt_len --->|<--- max_len - max_prompt_len --->|

The prompt is left-padded to `max_prompt_len`; the response starts at column
`max_prompt_len` and is right-padded. Masks are int32 0/1 arrays.
"""

import datetime
import json
import os
from typing import Any, Mapping, Optional, Protocol, Sequence, Union

import numpy as np

from rl_rewards import errors

ARITH_ALPHABET = "0123456789+-=\n#"
PLAIN_PROMPT = "{question}"
# `prompt_template` value that renders the checkpoint's chat template.
CHAT_PROMPT = "chat"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
# Variables `render_chat` sets itself; template kwargs may not override them.
_RESERVED_TEMPLATE_KEYS = ("messages", "tools", "documents",
                           "add_generation_prompt")


class Tokenizer(Protocol):
  """The interface the rest of the code relies on."""

  vocab_size: int
  pad_id: int
  bos_id: Optional[int]
  eos_id: int
  stop_ids: tuple[int, ...]
  end_of_turn_id: int
  prepend_bos: bool

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids) -> str:
    ...

  def delimiter_mask(self, delimiter: str = "\n",
                     vocab_size: Optional[int] = None) -> np.ndarray:
    ...

  def format_prompt(self, question: str) -> str:
    ...


def _check_prompt_template(template: str) -> None:
  if not isinstance(template, str) or "{question}" not in template:
    raise ValueError(
        "prompt_template must be a string containing '{question}', got "
        f"{template!r}.")


def _pad_mask(mask: np.ndarray, vocab_size: Optional[int]) -> np.ndarray:
  """`mask` [n] padded with False to [vocab_size] (a model embedding with
  more rows than the tokenizer has tokens)."""
  if vocab_size is None:
    return mask
  if vocab_size < mask.shape[0]:
    raise ValueError(
        f"vocab_size {vocab_size} is smaller than the tokenizer's "
        f"{mask.shape[0]} tokens.")
  return np.pad(mask, (0, vocab_size - mask.shape[0]))


def _first_stop(ids: list[int], stop_ids) -> list[int]:
  """`ids` up to (excluding) the first id of `stop_ids`."""
  stops = set(stop_ids)
  for position, i in enumerate(ids):
    if i in stops:
      return ids[:position]
  return ids


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
  stop_ids = (2,)
  end_of_turn_id = 2
  prepend_bos = True
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
    """Text of `ids`: stops at the first stop id (EOS), skips PAD and BOS.

    Args:
      ids: a 1-D sequence of ids (list, numpy or jax array).
      errors: "strict" raises ValueError on an id outside the vocabulary;
        "replace" writes U+FFFD for it (useful for sampled ids when the model
        vocabulary is padded beyond `vocab_size`).

    Returns:
      The decoded text.
    """
    table = self._id_to_char
    ids = _first_stop(_to_int_list(ids), self.stop_ids)
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

  def delimiter_mask(self, delimiter: str = "\n",
                     vocab_size: Optional[int] = None) -> np.ndarray:
    """bool [vocab_size]: True for tokens whose text ends with `delimiter`.

    With one character per token, only a one-character delimiter can end a
    token, so longer delimiters are rejected. `vocab_size` (>= the
    tokenizer's): the model's embedding rows; the ids past the tokenizer's
    vocabulary are False.
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
    return _pad_mask(mask, vocab_size)

  def format_prompt(self, question: str) -> str:
    return self.prompt_template.replace("{question}", question)


def _token_content(value) -> Optional[str]:
  """A special token of tokenizer_config.json: a string or an AddedToken
  dict {"content": ..., ...}; None for anything else."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def read_tokenizer_config(directory: str) -> dict:
  """tokenizer_config.json of a checkpoint directory ({} if absent)."""
  path = os.path.join(directory, TOKENIZER_CONFIG)
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    try:
      config = json.load(f)
    except json.JSONDecodeError as e:
      raise errors.InputError(f"{path}: invalid JSON ({e}).") from None
  if not isinstance(config, dict):
    raise errors.InputError(f"{path}: expected a JSON object.")
  return config


def template_special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
  """The special tokens a chat template sees, as transformers passes them.

  transformers renders templates with `tokenizer.special_tokens_map`: the
  named tokens (bos_token, eos_token, unk_token, sep_token, pad_token,
  cls_token, mask_token) and the checkpoint's own `*_token` keys (e.g.
  Gemma 3's boi_token), each as its string content. Values in
  tokenizer_config.json may be strings or AddedToken dicts.
  """
  out = {}
  extra = config.get("extra_special_tokens")
  items = list(config.items())
  if isinstance(extra, dict):
    items += list(extra.items())
  for key, value in items:
    if not key.endswith("_token"):
      continue
    content = _token_content(value)
    if content is not None:
      out[key] = content
  return out


def load_chat_template(directory: str) -> str:
  """The chat template of a checkpoint directory.

  As transformers loads it: chat_template.jinja next to tokenizer_config.json
  takes priority; otherwise tokenizer_config.json's `chat_template`, a string
  or a list of {"name", "template"} entries (or a dict name -> template) of
  which "default" is used.

  Raises:
    InputError: naming the file, when there is no template.
  """
  jinja_path = os.path.join(directory, CHAT_TEMPLATE_FILE)
  if os.path.isfile(jinja_path):
    with open(jinja_path, encoding="utf-8") as f:
      return f.read()
  config_path = os.path.join(directory, TOKENIZER_CONFIG)
  template = read_tokenizer_config(directory).get("chat_template")
  if isinstance(template, list):
    try:
      template = {t["name"]: t["template"] for t in template}
    except (KeyError, TypeError):
      raise errors.InputError(
          f"{config_path}: chat_template is a list but not of "
          '{"name": ..., "template": ...} entries.') from None
  if isinstance(template, dict):
    if "default" not in template:
      raise errors.InputError(
          f"{config_path}: chat_template has named templates "
          f"{sorted(template)} but no \"default\" one.")
    template = template["default"]
  if not isinstance(template, str) or not template:
    raise errors.InputError(
        f"{config_path}: no chat_template (and no {CHAT_TEMPLATE_FILE} in "
        f"{directory}); prompt_template='chat' needs the checkpoint's chat "
        "template, or use a format string with {question}.")
  return template


def compile_chat_template(template: str, *, source: str = "chat template"):
  """A Jinja2 template compiled as transformers compiles chat templates.

  Same environment: `ImmutableSandboxedEnvironment(trim_blocks=True,
  lstrip_blocks=True)` with the loopcontrols extension and a `generation`
  block tag (rendered as its body); the `tojson` filter without HTML escaping
  (`json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)`);
  globals `raise_exception(message)` (raises TemplateError) and
  `strftime_now(format)` (the local time now).
  """
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import ext as jinja_ext  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  class GenerationBlock(jinja_ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text for
    transformers' assistant masks; here it renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",),
                                     drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [],
                                    body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def strftime_now(format):  # pylint: disable=redefined-builtin
    return datetime.datetime.now().strftime(format)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[GenerationBlock, jinja_ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  try:
    return env.from_string(template)
  except jinja2.exceptions.TemplateSyntaxError as e:
    raise errors.InputError(
        f"{source}: Jinja syntax error at line {e.lineno}: {e.message}."
    ) from None


def parse_template_kwargs(value, *, key: str = "template_kwargs") -> dict:
  """Extra chat-template variables: a dict, a JSON object string, or
  None/"" for none. Raises InputError naming `key`."""
  if value is None or value == "":
    return {}
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise errors.InputError(f"{key}: invalid JSON ({e}).") from None
  if hasattr(value, "to_dict"):  # ml_collections.ConfigDict.
    value = value.to_dict()
  if not isinstance(value, Mapping):
    raise errors.InputError(
        f"{key}: must be a JSON object of template variables, e.g. "
        f'{{"enable_thinking": false}}, got {value!r}.')
  bad = sorted(k for k in value if k in _RESERVED_TEMPLATE_KEYS)
  if bad:
    raise errors.InputError(
        f"{key}: {bad} are set by the prompt renderer itself.")
  return dict(value)


_EOS_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>", "[SEP]",
                   "<|end_of_text|>", "<|eot_id|>")
_BOS_CANDIDATES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>",
                   "[CLS]")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|endoftext|>")
# Assistant text used to find what a chat template writes after an
# assistant message (its end-of-turn token).
_TURN_PROBE = "Zq7ResponseProbe3x"


class HFTokenizer:
  """A Hugging Face `tokenizer.json` behind the `CharTokenizer` interface.

  Special tokens are resolved in this order: the token strings given to the
  constructor; `tokenizer_config.json` next to the file (keys `bos_token`,
  `eos_token`, `pad_token`); common names present in the vocabulary. EOS is
  required; BOS may be absent (Qwen-style models have none), then prompts get
  no BOS; PAD falls back to EOS.

  Prompts: `prompt_template` is a format string with "{question}" (BOS, if
  any, is prepended), or "chat": the checkpoint's chat template
  (chat_template.jinja or tokenizer_config.json's `chat_template`) renders
  [{"role": "system", "content": system_prompt}] (when given) and
  {"role": "user", "content": question} with add_generation_prompt=True, the
  special tokens of tokenizer_config.json and `template_kwargs` as
  variables, exactly as transformers' `apply_chat_template(...,
  tokenize=False)`; the template writes BOS itself, so none is prepended.

  Attributes:
    vocab_size: size of the vocabulary including added tokens.
    pad_id, bos_id (or None), eos_id.
    stop_ids: ids that end a response: eos_id, every id of
      generation_config.json's `eos_token_id` (an int or a list) and
      end_of_turn_id, without repeats.
    end_of_turn_id: the token that ends an SFT target: with a chat template,
      the first special token the template writes after an assistant
      message (<|im_end|> for Qwen, <|eot_id|> for Llama 3, <end_of_turn>
      for Gemma 3); eos_id otherwise.
    prepend_bos: whether prompts get BOS prepended (not with "chat").
    prompt_template: the format string, or "chat".
  """

  def __init__(self, path: str, *,
               bos_token: Optional[str] = None,
               eos_token: Optional[str] = None,
               pad_token: Optional[str] = None,
               prompt_template: str = PLAIN_PROMPT,
               system_prompt: Optional[str] = None,
               template_kwargs: Union[None, str, Mapping[str, Any]] = None):
    import tokenizers  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise ValueError(f"tokenizer file not found: {path}")
    self.chat = prompt_template == CHAT_PROMPT
    if not self.chat:
      _check_prompt_template(prompt_template)
      if system_prompt is not None or template_kwargs:
        raise ValueError(
            "system_prompt and template_kwargs need prompt_template='chat', "
            f"got prompt_template={prompt_template!r}.")
    self.path = path
    self.directory = os.path.dirname(path)
    self.prompt_template = prompt_template
    self.system_prompt = system_prompt
    self._tok = tokenizers.Tokenizer.from_file(path)
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    raw_config = read_tokenizer_config(self.directory)
    file_config = {key: _token_content(raw_config.get(f"{key}_token"))
                   for key in ("bos", "eos", "pad")}
    file_config = {k: v for k, v in file_config.items() if v is not None}
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
    self.prepend_bos = not self.chat
    self.end_of_turn_id = self.eos_id
    if self.chat:
      self.template_kwargs = parse_template_kwargs(template_kwargs)
      self._template_vars = {**template_special_tokens(raw_config),
                             **self.template_kwargs}
      self._template = compile_chat_template(
          load_chat_template(self.directory),
          source=f"chat template of {self.directory}")
      self.end_of_turn_id = self._find_end_of_turn()
    else:
      self.template_kwargs = {}
    stops = [self.eos_id] + self._generation_eos_ids() + [self.end_of_turn_id]
    self.stop_ids = tuple(dict.fromkeys(stops))

  def _generation_eos_ids(self) -> list[int]:
    path = os.path.join(self.directory, GENERATION_CONFIG)
    if not os.path.isfile(path):
      return []
    with open(path, encoding="utf-8") as f:
      try:
        config = json.load(f)
      except json.JSONDecodeError as e:
        raise errors.InputError(f"{path}: invalid JSON ({e}).") from None
    ids = config.get("eos_token_id") if isinstance(config, dict) else None
    if ids is None:
      return []
    ids = ids if isinstance(ids, list) else [ids]
    for i in ids:
      if (isinstance(i, bool) or not isinstance(i, int) or
          not 0 <= i < self.vocab_size):
        raise errors.InputError(
            f"{path}: eos_token_id must be token ids in [0, "
            f"{self.vocab_size}) (an int or a list), got {ids!r}.")
    return list(ids)

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

  def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                  add_generation_prompt: bool = True) -> str:
    """The chat template applied to `messages` (role/content dicts), as
    `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
    with this tokenizer's special tokens and template kwargs."""
    if not self.chat:
      raise ValueError(
          f"render_chat needs prompt_template='chat', got "
          f"{self.prompt_template!r}.")
    import jinja2  # pylint: disable=g-import-not-at-top
    try:
      return self._template.render(
          messages=list(messages), tools=None, documents=None,
          add_generation_prompt=add_generation_prompt, **self._template_vars)
    except jinja2.exceptions.TemplateError as e:
      raise errors.InputError(
          f"chat template of {self.directory}: {e}") from None

  def _messages(self, question: str, answer: Optional[str] = None):
    messages = []
    if self.system_prompt is not None:
      messages.append({"role": "system", "content": self.system_prompt})
    messages.append({"role": "user", "content": question})
    if answer is not None:
      messages.append({"role": "assistant", "content": answer})
    return messages

  def _find_end_of_turn(self) -> int:
    """The first special token the template writes after an assistant
    message's content; EOS when it writes none (or rejects the probe)."""
    try:
      text = self.render_chat(self._messages("Hi", _TURN_PROBE),
                              add_generation_prompt=False)
    except errors.InputError:
      return self.eos_id
    at = text.rfind(_TURN_PROBE)
    if at < 0:
      return self.eos_id
    special = {i for i, t in self._tok.get_added_tokens_decoder().items()
               if t.special}
    for i in self.encode(text[at + len(_TURN_PROBE):]):
      if i in special:
        return i
    return self.eos_id

  def encode(self, text: str) -> list[int]:
    """Ids of `text` without any added special tokens."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids, errors: str = "strict") -> str:
    """Text of `ids`: stops at the first stop id, skips PAD, BOS and special
    tokens.

    Args:
      ids: a 1-D sequence of ids (list, numpy or jax array).
      errors: "strict" raises ValueError on an id outside the vocabulary;
        "replace" drops it.

    Returns:
      The decoded text.
    """
    ids = _first_stop(_to_int_list(ids), self.stop_ids)
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

  def delimiter_mask(self, delimiter: str = "\n",
                     vocab_size: Optional[int] = None) -> np.ndarray:
    """bool [vocab_size]: tokens whose decoded text contains `delimiter`.

    `vocab_size` (>= the tokenizer's): the model's embedding rows when they
    are padded past the tokenizer's vocabulary; the padding ids are False.
    None: the tokenizer's `vocab_size`.
    """
    if not isinstance(delimiter, str) or not delimiter:
      raise ValueError(
          f"delimiter must be a non-empty string, got {delimiter!r}.")
    if delimiter not in self._delimiter_masks:
      texts = self._tok.decode_batch([[i] for i in range(self.vocab_size)],
                                     skip_special_tokens=False)
      self._delimiter_masks[delimiter] = np.array(
          [delimiter in t for t in texts], dtype=bool)
    return _pad_mask(self._delimiter_masks[delimiter].copy(), vocab_size)

  def format_prompt(self, question: str) -> str:
    if self.chat:
      return self.render_chat(self._messages(question))
    return self.prompt_template.replace("{question}", question)


def _prompt_ids(tokenizer, question: str) -> list[int]:
  ids = tokenizer.encode(tokenizer.format_prompt(question))
  if tokenizer.bos_id is not None and tokenizer.prepend_bos:
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
    targets: B target responses; `tokenizer.end_of_turn_id` is appended (the
      chat template's end-of-turn token, or EOS).
    max_prompt_len: P, the left-padded prompt width.
    max_len: T, the total width; responses get T - P columns.

  Returns:
    dict with int32 [B, T] arrays `tokens`, `loss_mask` (1 on target tokens
    including the end token), `attention_mask` (1 on prompt, target and end
    token).

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
    ids = tokenizer.encode(target) + [tokenizer.end_of_turn_id]
    if len(ids) > response_len:
      raise ValueError(
          f"target {b} has {len(ids)} tokens (including the end token), more "
          "than "
          f"max_len - max_prompt_len = {response_len}: {target[:80]!r}.")
    tokens[b, max_prompt_len:max_prompt_len + len(ids)] = ids
    loss_mask[b, max_prompt_len:max_prompt_len + len(ids)] = 1
  attention_mask = loss_mask.copy()
  attention_mask[:, :max_prompt_len] = prompt_mask
  return {"tokens": tokens, "loss_mask": loss_mask,
          "attention_mask": attention_mask}
