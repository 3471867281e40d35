"""Test doubles for the PRM tests: a scripted arithmetic policy, a recording
sampler wrapper and a bigram decoder with hand-set transition probabilities.

`ScriptedPolicy` has the interface of `labels.PolicySampler.sample`: it reads
each row's question and the steps written so far, and writes the remaining
steps of the arithmetic solution (or one step, with a stop mask), each step
right with probability `p_correct` and off by +1..+9 otherwise. A wrong step
is followed by steps computed correctly from the wrong value, so with
`p_correct=1` a prefix can be completed correctly iff it has no error yet.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import models

_QUESTION_RE = re.compile(r"([+-]?)([0-9]+)")
_STEP_RE = re.compile(r"([0-9]+)([+-])([0-9]+)=([0-9]+)")


def seed_words(rng) -> list:
  """The words of a JAX key (typed or raw), for seeding numpy."""
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  return [int(x) for x in np.asarray(rng).ravel()]


def parse_question(question: str):
  """(first, ops, operands) of a question like "23+07-15="."""
  parts = _QUESTION_RE.findall(question.rstrip("="))
  first = int(parts[0][1])
  return first, [op for op, _ in parts[1:]], [int(b) for _, b in parts[1:]]


class ScriptedPolicy:
  """A stochastic arithmetic "policy" with the `PolicySampler` interface."""

  def __init__(self, tokenizer, *, p_correct: float, max_new_tokens: int,
               delimiter: str = "\n"):
    self.tokenizer = tokenizer
    self.pad_id = tokenizer.pad_id
    self.eos_id = tokenizer.eos_id
    self.max_new_tokens = max_new_tokens
    self.p_correct = p_correct
    self.delimiter = delimiter
    self.delimiter_mask = tokenizer.delimiter_mask(delimiter)
    self.calls = []

  def _next_lines(self, text, generator, one_step):
    question, _, response = text.partition("=")
    first, ops, operands = parse_question(question)
    lines = response.split(self.delimiter)
    if lines[-1]:
      raise AssertionError(f"prefix {response!r} does not end at a step.")
    done = lines[:-1]
    if len(done) > len(ops) or any(line.startswith("#") for line in done):
      return [], True
    value = first
    for line in done:
      match = _STEP_RE.fullmatch(line)
      if match:
        value = int(match.group(4))
    out, answered = [], False
    for j in range(len(done), len(ops) + 1):
      right = generator.random() < self.p_correct
      error = 0 if right else int(generator.integers(1, 10))
      if j < len(ops):
        result = value + operands[j] if ops[j] == "+" else value - operands[j]
        result += error
        out.append(f"{value:03d}{ops[j]}{operands[j]:02d}={result:03d}")
        value = result
      else:
        out.append(f"#{value + error:03d}")
        answered = True
      if one_step:
        break
    return out, answered

  def sample(self, tokens, mask, rng, *, num_samples: int = 1,
             max_new_tokens=None, stop_mask=None) -> dict:
    tokens = np.asarray(tokens, np.int32)
    mask = np.asarray(mask, np.int32)
    budget = max_new_tokens or self.max_new_tokens
    generator = np.random.default_rng(seed_words(rng))
    rows, width = tokens.shape
    count = rows * num_samples
    out_tokens = np.full((count, width + budget), self.pad_id, np.int32)
    response_mask = np.zeros((count, width + budget), np.int32)
    truncated = np.zeros((count,), bool)
    stopped = np.zeros((count,), bool)
    for r in range(rows):
      text = self.tokenizer.decode(tokens[r][mask[r].astype(bool)])
      for s in range(num_samples):
        i = r * num_samples + s
        lines, answered = self._next_lines(text, generator,
                                           stop_mask is not None)
        body = self.tokenizer.encode(self.delimiter.join(lines))
        if answered:
          new = body + [self.eos_id]
        else:
          new = body + self.tokenizer.encode(self.delimiter)
          stopped[i] = True
        if len(new) > budget:
          new, truncated[i], stopped[i] = new[:budget], True, False
        out_tokens[i, :width] = tokens[r]
        out_tokens[i, width:width + len(new)] = new
        response_mask[i, width:width + len(new)] = 1
    step_ids = np.full(out_tokens.shape, -1, np.int32)
    for i in range(count):
      new = out_tokens[i, width:width + response_mask[i].sum()].tolist()
      step = 0
      for t, token in enumerate(new):
        step_ids[i, width + t] = step
        closes_final = (t == len(new) - 2 and new[-1] == self.eos_id)
        if self.delimiter_mask[token] and not closes_final:
          step += 1
    out = {"tokens": out_tokens, "response_mask": response_mask,
           "step_ids": step_ids, "lengths": response_mask.sum(1),
           "truncated": truncated, "stopped": stopped}
    self.calls.append({"tokens": tokens, "mask": mask,
                       "num_samples": num_samples, "out": out})
    return out


class RecordingSampler:
  """Wraps a sampler and records every call's inputs and outputs."""

  def __init__(self, sampler):
    self._sampler = sampler
    self.calls = []

  def __getattr__(self, name):
    return getattr(self._sampler, name)

  def sample(self, tokens, mask, rng, **kwargs):
    out = self._sampler.sample(tokens, mask, rng, **kwargs)
    self.calls.append({"tokens": np.asarray(tokens), "mask": np.asarray(mask),
                       "num_samples": kwargs.get("num_samples", 1),
                       "out": out})
    return out


def bigram_params(model_config, transitions, rng=None):
  """Parameters of a decoder that is a bigram model with given logits.

  The blocks' output projections are zeroed, so the residual stream is the
  current token's embedding; embeddings are one-hot (needs D >= V) and the
  LM head is the transition table, so logits[t] = c·transitions[token_t] with
  c = 1 / rms(one-hot) ≈ sqrt(D).

  Args:
    model_config: a config with hidden_size >= vocab_size.
    transitions: [V, V] logits of the next token given the current one.
    rng: key for the (irrelevant) remaining parameters.

  Returns:
    Parameters with an "lm" head.
  """
  vocab, dim = model_config.vocab_size, model_config.hidden_size
  assert dim >= vocab, (dim, vocab)
  params = models.init_params(model_config,
                              jax.random.key(0) if rng is None else rng)
  params = jax.tree.map(np.asarray, params)
  params = {k: v for k, v in params.items()}
  for name in params:
    if name.startswith("layers_"):
      layer = {k: dict(v) for k, v in params[name].items()}
      layer["attention"]["o_kernel"] = np.zeros_like(
          layer["attention"]["o_kernel"])
      layer["mlp"]["down_kernel"] = np.zeros_like(layer["mlp"]["down_kernel"])
      params[name] = layer
  params["embed"] = np.eye(vocab, dim, dtype=np.float32)
  params["final_norm"] = {"scale": np.ones((dim,), np.float32)}
  head = np.zeros((dim, vocab), np.float32)
  head[:vocab] = np.asarray(transitions, np.float32)
  params["lm_head"] = head
  return jax.tree.map(jnp.asarray, params)
