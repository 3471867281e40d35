"""Jitted autoregressive sampling with a KV cache.

    out = sample(cfg, params, prompt_tokens, prompt_mask, rng,
                 max_new_tokens=72, temperature=1.0, top_p=1.0,
                 eos_id=2, pad_id=0, delimiter_mask=newline_mask,
                 num_samples=8)

The left-padded prompts [B, P] are prefilled once; with `num_samples = n` the
cache is then tiled so that every prompt gets n continuations, rows ordered
prompt-major (the n samples of a prompt are contiguous, docs/data_model.md).
Decoding runs in a `lax.while_loop` that stops as soon as every row has
emitted EOS (or after `max_new_tokens`); `eos_id` may list several ids (every
end-of-sequence id of the checkpoint), any of which ends a row. With
`num_tokens` below the model's vocab_size, the embedding's padding rows are
never sampled. To continue a partial response, put it in the
prompt: a prefix is just a longer prompt. With a `stop_mask`, a row also ends
after emitting any token in the mask (e.g. the step delimiter): that is how
step-level search samples one step at a time.

Attention reads every slot of the KV cache at each step, so a cache sized
for the longest response makes early steps pay for slots that are still
empty. For G >= `SEGMENTED_DECODE_MIN_TOKENS` the cache therefore starts at
P + G/8 slots and grows to P + G/4, P + G/2 and P + G between decoding
segments (`decode_segment_ends`); a generation that stops early never pays
for the longer caches.

Output arrays are [B * n, P + G] with G = max_new_tokens: prompt slots first,
then the response slots. A row is done after its first EOS; later slots hold
`pad_id` and are masked out. Sampling randomness for row r at step g comes
from fold_in(fold_in(rng, r), g), so a row's sample does not depend on the
rest of the batch: `sample(prompts, num_samples=n)` equals
`sample(repeat(prompts, n))`.
"""

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards.models import config as config_lib
from rl_rewards.models import model as model_lib
from rl_rewards.tasks import segmentation

Array = jax.Array


class SampleOutput(NamedTuple):
  """Sampled sequences, batch-first, length P + G.

  Attributes:
    tokens: [N, P+G] int32, prompt then response; `pad_id` after EOS (any
      of the `eos_id` ids).
    attention_mask: [N, P+G] int32, 1 on real prompt tokens and on response
      tokens (the union of the prompt mask and `response_mask`).
    response_mask: [N, P+G] int32, 1 on generated tokens up to and including
      EOS, 0 on the prompt and padding.
    logprobs: [N, P+G] float32, log pi(token) under the untempered policy for
      generated tokens, 0 elsewhere (the softmax over all V rows, padding
      rows included, as `models.token_logprobs` computes it).
    step_ids: [N, P+G] int32, index of the reasoning step of each response
      token (a step ends at each delimiter token and at the last response
      token), -1 on the prompt and padding.
    lengths: [N] int32, number of response tokens (EOS included).
    truncated: [N] bool, True when the row reached G tokens without EOS or
      a stop token.
    stopped: [N] bool, True when the row ended on a token of `stop_mask`
      (kept in the response, like EOS) rather than on EOS; always False
      without a stop mask.
  """
  tokens: Array
  attention_mask: Array
  response_mask: Array
  logprobs: Array
  step_ids: Array
  lengths: Array
  truncated: Array
  stopped: Array


def top_p_logits(logits: Array, top_p: Array) -> Array:
  """Nucleus filtering: keeps the smallest set of most likely tokens whose
  probability mass reaches `top_p` and sets the other logits to -inf.

  With the tokens in descending order of logit, ties broken by ascending id
  (a stable sort), token k is kept iff the mass before it is below p:

    keep[order[k]] = sum_{j < k} softmax(logits)[order[j]] < top_p

  so the most likely token is always kept (its mass before is 0 < p) and,
  among equal logits, lower ids are kept first. E.g. 4 equal logits with
  p = 0.3 keep ids 0 and 1; probabilities [.4, .3, .3] with p = 0.5 keep ids
  0 and 1. Jittable, with one sort of the values per row: the kept count k
  fixes the threshold t = k-th largest logit; every logit above t is kept,
  and of the logits equal to t the k - #{logit > t} lowest ids.

  Args:
    logits: [..., V] float logits.
    top_p: scalar nucleus mass in (0, 1] (may be traced).

  Returns:
    [..., V] logits with the tokens outside the nucleus set to -inf.
  """
  sorted_logits = -jnp.sort(-logits, axis=-1)
  probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
  # Exclusive prefix sum (no `cumsum - probs` rounding).
  cumulative = jnp.cumsum(probs, axis=-1)
  mass_before = jnp.concatenate(
      [jnp.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], axis=-1)
  num_kept = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1), 1)
  threshold = jnp.take_along_axis(sorted_logits, num_kept[..., None] - 1,
                                  axis=-1)
  above = logits > threshold
  tied = logits == threshold
  ties_kept = num_kept[..., None] - jnp.sum(above, axis=-1, keepdims=True)
  # Rank of each tied logit among the tied ones, by ascending id (1-based).
  tie_rank = jnp.cumsum(tied, axis=-1)
  keep = above | (tied & (tie_rank <= ties_kept))
  return jnp.where(keep, logits, -jnp.inf)


# Below this many noise values ([N, G, V]) the Gumbel noise of the whole
# generation is drawn before the decoding loop (one vectorised draw instead of
# one per step); above it, each step draws its own [N, V].
_PRECOMPUTED_NOISE_LIMIT = 1 << 23


def _gumbel_noise(rng, row_ids, steps, vocab_size):
  """Gumbel noise [N, len(steps), V] for sampling by argmax(logits + noise).

  The noise of row r at step g comes from fold_in(fold_in(rng, r), g) alone,
  so it does not depend on the batch size or on when it is drawn.
  """
  def one(row, step):
    key = jax.random.fold_in(jax.random.fold_in(rng, row), step)
    return jax.random.gumbel(key, (vocab_size,), jnp.float32)
  return jax.vmap(lambda r: jax.vmap(lambda g: one(r, g))(steps))(row_ids)


# From this many new tokens on, decoding runs in segments with a growing
# cache (see the module docstring); below it, one segment with the full cache
# (each segment compiles its own copy of the decoding loop).
SEGMENTED_DECODE_MIN_TOKENS = 128


def decode_segment_ends(max_new_tokens: int) -> Tuple[int, ...]:
  """Last step (exclusive) of each decoding segment: the cache of segment i
  has P + ends[i] slots. (G,) below `SEGMENTED_DECODE_MIN_TOKENS`, else
  (G/8, G/4, G/2, G) rounded down."""
  g = max_new_tokens
  if g < SEGMENTED_DECODE_MIN_TOKENS:
    return (g,)
  return tuple(sorted({g // 8, g // 4, g // 2, g}))


def _choose_tokens(logits, noise, temperature, top_p, *, greedy, use_top_p,
                   num_tokens=None):
  """Next tokens [N] and their untempered log-probs [N] from logits [N, V].

  Sampling is argmax(logits / temperature + Gumbel noise) (the Gumbel-max
  trick, as in `jax.random.categorical`), after nucleus filtering. With
  `num_tokens` < V, ids >= num_tokens (embedding rows past the tokenizer's
  vocabulary) get logit -inf before greedy or sampled selection, so they are
  never chosen. The log-probs stay those of the full [V] softmax, the
  convention of `models.token_logprobs` that the trainer recomputes.
  """
  logp = jax.nn.log_softmax(logits, axis=-1)
  if num_tokens is not None and num_tokens < logits.shape[-1]:
    logits = jnp.where(jnp.arange(logits.shape[-1]) < num_tokens, logits,
                       -jnp.inf)
  if greedy:
    tokens = jnp.argmax(logits, axis=-1)
  else:
    scaled = logits / temperature
    if use_top_p:
      scaled = top_p_logits(scaled, top_p)
    tokens = jnp.argmax(scaled + noise, axis=-1)
  tokens = tokens.astype(jnp.int32)
  return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


@functools.partial(
    jax.jit,
    static_argnames=("cfg", "max_new_tokens", "num_samples", "eos_ids",
                     "pad_id", "greedy", "use_top_p", "segment_ends",
                     "num_tokens"))
def _jit_sample(params, prompt_tokens, prompt_mask, rng, temperature, top_p,
                delimiter_mask, stop_mask, *, cfg, max_new_tokens, num_samples,
                eos_ids, pad_id, greedy, use_top_p, segment_ends, num_tokens):
  batch, prompt_len = prompt_tokens.shape
  new = max_new_tokens
  prompt_valid = prompt_mask.astype(bool)
  cache = model_lib.init_cache(cfg, batch, prompt_len + segment_ends[0])
  prefill_logits, cache = model_lib.apply(
      cfg, params, prompt_tokens, attention_mask=prompt_valid, cache=cache,
      cache_index=0, last_only=True)
  last_logits = prefill_logits[:, 0]
  num_prompt = jnp.sum(prompt_valid, axis=-1, dtype=jnp.int32)
  if num_samples > 1:
    tile = functools.partial(jnp.repeat, repeats=num_samples, axis=0)
    last_logits, num_prompt, prompt_tokens, prompt_valid = jax.tree.map(
        tile, (last_logits, num_prompt, prompt_tokens, prompt_valid))
    cache = model_lib.repeat_cache(cache, num_samples)
  rows = batch * num_samples
  row_ids = jnp.arange(rows)
  choose = functools.partial(_choose_tokens, temperature=temperature,
                             top_p=top_p, greedy=greedy, use_top_p=use_top_p,
                             num_tokens=num_tokens)
  precompute = (not greedy and
                rows * new * cfg.vocab_size <= _PRECOMPUTED_NOISE_LIMIT)
  if precompute:
    all_noise = _gumbel_noise(rng, row_ids, jnp.arange(new), cfg.vocab_size)

  def noise_at(step):
    if greedy:
      return None
    if precompute:
      return jax.lax.dynamic_index_in_dim(all_noise, step, axis=1,
                                          keepdims=False)
    return _gumbel_noise(rng, row_ids, step[None], cfg.vocab_size)[:, 0]

  def emit(step, logits, done, out_tokens, out_logp):
    """Picks token `step` of every row and writes it to the outputs."""
    token, logp = choose(logits, noise_at(step))
    token = jnp.where(done, pad_id, token)
    logp = jnp.where(done, 0.0, logp)
    out_tokens = jax.lax.dynamic_update_slice(out_tokens, token[:, None],
                                              (0, step))
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None],
                                            (0, step))
    done = done | _is_eos(token, eos_ids)
    if stop_mask is not None:
      done = done | stop_mask[token]
    return token, done, out_tokens, out_logp

  # Loop state: (step g, logits for token g, rows done before g, outputs,
  # cache). Each iteration picks token g and feeds it to get the logits of
  # token g + 1; the last token is picked after the loop, so no forward pass
  # is spent on a token that is never sampled from.
  state = (jnp.int32(0), last_logits, jnp.zeros((rows,), bool),
           jnp.full((rows, new), pad_id, jnp.int32),
           jnp.zeros((rows, new), jnp.float32), cache)

  def body(state):
    step, logits, done, out_tokens, out_logp, cache = state
    token, next_done, out_tokens, out_logp = emit(step, logits, done,
                                                  out_tokens, out_logp)
    logits, cache = model_lib.apply(
        cfg, params, token[:, None], attention_mask=~done[:, None],
        positions=(num_prompt + step)[:, None], cache=cache,
        cache_index=prompt_len + step)
    return step + 1, logits[:, 0], next_done, out_tokens, out_logp, cache

  for end in segment_ends:
    # Steps up to `end` write cache slots below prompt_len + end.
    *carry, cache = state
    if cache.max_len < prompt_len + end:
      cache = model_lib.grow_cache(cache, prompt_len + end)
    last = min(end, new - 1)
    state = jax.lax.while_loop(
        lambda s, last=last: (s[0] < last) & ~jnp.all(s[2]), body,
        (*carry, cache))
  step, logits, done, out_tokens, out_logp, _ = state
  # The loops stop at step G - 1 or once every row is done; in the second
  # case this writes padding at `step`, which is already padding.
  _, _, out_tokens, out_logp = emit(step, logits, done, out_tokens, out_logp)

  # Response tokens run up to and including the first EOS or stop token
  # (robust to pad_id == eos_id: padding only follows the end).
  is_eos = _is_eos(out_tokens, eos_ids)
  is_end = is_eos
  if stop_mask is not None:
    is_end = is_end | stop_mask[out_tokens]
  has_end = jnp.any(is_end, axis=-1)
  first_end = jnp.where(has_end, jnp.argmax(is_end, axis=-1), new)
  response_valid = jnp.arange(new)[None, :] <= first_end[:, None]
  ended_on_eos = has_end & jnp.take_along_axis(
      is_eos, jnp.minimum(first_end, new - 1)[:, None], axis=1)[:, 0]
  lengths = jnp.sum(response_valid, axis=-1, dtype=jnp.int32)

  zeros_prompt = jnp.zeros((rows, prompt_len), jnp.int32)
  tokens = jnp.concatenate([prompt_tokens.astype(jnp.int32), out_tokens], 1)
  response_mask = jnp.concatenate(
      [zeros_prompt, response_valid.astype(jnp.int32)], axis=1)
  attention_mask = jnp.concatenate(
      [prompt_valid.astype(jnp.int32), response_valid.astype(jnp.int32)], 1)
  logprobs = jnp.concatenate(
      [jnp.zeros((rows, prompt_len), jnp.float32),
       jnp.where(response_valid, out_logp, 0.0)], axis=1)
  # The one step rule of the codebase (docs/data_model.md), shared with PRM
  # training, scoring and search.
  step_ids = segmentation.step_ids_from_tokens(
      tokens, response_mask, delimiter_mask, eos_id=eos_ids or None)
  return SampleOutput(tokens=tokens, attention_mask=attention_mask,
                      response_mask=response_mask, logprobs=logprobs,
                      step_ids=step_ids, lengths=lengths, truncated=~has_end,
                      stopped=has_end & ~ended_on_eos)


def _is_eos(tokens, eos_ids):
  """bool, shaped like `tokens`: True on any of the ids `eos_ids` (a static
  tuple, possibly empty)."""
  out = jnp.zeros(tokens.shape, bool)
  for i in eos_ids:
    out = out | (tokens == i)
  return out


def _concrete(x) -> Optional[np.ndarray]:
  """x as numpy if it is a concrete value, else None (inside a trace, or an
  array spread over several processes)."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return None
  return np.asarray(x)


def _check_token_id(name, value, vocab_size):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an int token id, got {value!r}.")
  if not 0 <= value < vocab_size:
    raise ValueError(f"{name}={value} is outside the vocabulary "
                     f"[0, {vocab_size}).")


def _check_sampling(cfg, temperature, top_p, eos_id, pad_id, num_tokens):
  """Checks the sampling arguments; returns (eos ids, num_tokens or None
  when it is the whole vocabulary)."""
  if not float(temperature) >= 0:
    raise ValueError(f"temperature must be >= 0, got {temperature!r}.")
  if not 0 < float(top_p) <= 1:
    raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")
  eos_ids = segmentation.eos_id_tuple(eos_id)
  for i in eos_ids:
    _check_token_id("eos_id", i, cfg.vocab_size)
  _check_token_id("pad_id", pad_id, cfg.vocab_size)
  if num_tokens is not None:
    if (isinstance(num_tokens, bool) or
        not isinstance(num_tokens, (int, np.integer)) or
        not 1 <= num_tokens <= cfg.vocab_size):
      raise ValueError(f"num_tokens must be an int in [1, {cfg.vocab_size}] "
                       f"(the model's vocab_size), got {num_tokens!r}.")
    num_tokens = None if num_tokens == cfg.vocab_size else int(num_tokens)
  return eos_ids, num_tokens


def sample(cfg: config_lib.ModelConfig, params: Any, prompt_tokens,
           prompt_mask, rng: Array, *, max_new_tokens: int,
           temperature: float = 1.0, top_p: float = 1.0,
           eos_id, pad_id: int, delimiter_mask=None,
           num_samples: int = 1, stop_mask=None,
           num_tokens: Optional[int] = None) -> SampleOutput:
  """Samples continuations of left-padded prompts.

  Args:
    cfg: model configuration (static).
    params: parameters with an "lm" head.
    prompt_tokens: [B, P] int token ids, left-padded.
    prompt_mask: [B, P], 1 on real prompt tokens (a suffix of each row).
    rng: PRNG key (unused for greedy decoding).
    max_new_tokens: G, response slots.
    temperature: 0 for greedy decoding, else the softmax temperature.
    top_p: nucleus mass in (0, 1]; 1 disables the filter.
    eos_id: the end-of-sequence id, or a sequence of them (e.g. every id of
      a checkpoint's generation_config.json `eos_token_id`, see
      `HFTokenizer.stop_ids`): any of them ends a row and is included in the
      response. None or (): rows never end early (always G tokens, all
      marked truncated).
    pad_id: written after EOS.
    delimiter_mask: optional bool [V], True on tokens that end a reasoning
      step (e.g. newline). None: one step per response.
    num_samples: n continuations per prompt; rows are prompt-major.
    stop_mask: optional bool [V]: a row also ends after emitting one of
      these tokens (kept in the response and counted in `lengths`; the row is
      `stopped`, not `truncated`). Passing `delimiter_mask` here samples one
      reasoning step per call. None: rows end on EOS only.
    num_tokens: the tokenizer's vocabulary size when the model's embedding
      has more rows (cfg.vocab_size, padded for efficiency): ids in
      [num_tokens, cfg.vocab_size) are never sampled, greedy or not. None:
      every id may be sampled.

  Returns:
    `SampleOutput` with [B * n, P + G] arrays. Changing temperature or top_p
    between calls does not recompile (only switching greedy <-> sampled or
    top_p == 1 <-> top_p < 1 does).
  """
  prompt_tokens = jnp.asarray(prompt_tokens)
  prompt_mask = jnp.asarray(prompt_mask)
  if prompt_tokens.ndim != 2 or prompt_tokens.shape[1] == 0:
    raise ValueError(f"prompt_tokens must be [B, P] with P > 0, got shape "
                     f"{prompt_tokens.shape}.")
  if not jnp.issubdtype(prompt_tokens.dtype, jnp.integer):
    raise ValueError(f"prompt_tokens must be integer ids, got dtype "
                     f"{prompt_tokens.dtype}.")
  if prompt_mask.shape != prompt_tokens.shape:
    raise ValueError(f"prompt_mask shape {prompt_mask.shape} differs from "
                     f"prompt_tokens shape {prompt_tokens.shape}.")
  mask_np = _concrete(prompt_mask)
  if mask_np is not None and np.any(np.diff(mask_np.astype(np.int32), axis=1)
                                    < 0):
    bad = int(np.nonzero(np.any(np.diff(mask_np.astype(np.int32), axis=1) < 0,
                                axis=1))[0][0])
    raise ValueError(f"prompt_mask row {bad} is not left-padded (a real token "
                     "is followed by padding); pad prompts on the left.")
  if (isinstance(max_new_tokens, bool) or
      not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1):
    raise ValueError(f"max_new_tokens must be an int >= 1, got "
                     f"{max_new_tokens!r}.")
  total = prompt_tokens.shape[1] + max_new_tokens
  if total > cfg.max_position_embeddings:
    raise ValueError(
        f"prompt length {prompt_tokens.shape[1]} + max_new_tokens "
        f"{max_new_tokens} = {total} exceeds the model context "
        f"(max_position_embeddings={cfg.max_position_embeddings}).")
  if not (isinstance(num_samples, (int, np.integer)) and num_samples >= 1):
    raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}.")
  eos_ids, num_tokens = _check_sampling(cfg, temperature, top_p, eos_id,
                                        pad_id, num_tokens)
  if delimiter_mask is None:
    delimiter_mask = jnp.zeros((cfg.vocab_size,), bool)
  delimiter_mask = jnp.asarray(delimiter_mask)
  if delimiter_mask.shape != (cfg.vocab_size,):
    raise ValueError(f"delimiter_mask must have shape ({cfg.vocab_size},), "
                     f"got {delimiter_mask.shape}.")
  if stop_mask is not None:
    stop_mask = jnp.asarray(stop_mask)
    if stop_mask.shape != (cfg.vocab_size,):
      raise ValueError(f"stop_mask must have shape ({cfg.vocab_size},), "
                       f"got {stop_mask.shape}.")
    stop_mask = stop_mask.astype(bool)
  greedy = float(temperature) == 0.0
  return _jit_sample(
      params, prompt_tokens, prompt_mask, rng,
      jnp.float32(1.0 if greedy else temperature), jnp.float32(top_p),
      delimiter_mask.astype(bool), stop_mask, cfg=cfg, max_new_tokens=int(max_new_tokens),
      num_samples=int(num_samples), eos_ids=eos_ids, pad_id=int(pad_id),
      num_tokens=num_tokens,
      greedy=greedy, use_top_p=(not greedy) and float(top_p) < 1.0,
      segment_ends=decode_segment_ends(int(max_new_tokens)))


# ---------------------------------------------------------------------------
# Continued decoding: one turn of a multi-turn episode from a filled cache.


class DecodeOutput(NamedTuple):
  """Tokens decoded from a cache by `decode_from_cache`.

  Attributes:
    tokens: [N, G] int32, the row's new tokens then `pad_id`.
    logprobs: [N, G] float32, log pi(token) under the untempered policy (the
      full-V softmax, as in `SampleOutput`), 0 after the row's end.
    lengths: [N] int32, new tokens of each row (its end token included).
    eos: [N] bool, the row ended on an `eos_id` token.
    stopped: [N] bool, the row ended on a `stop_mask` token (and not EOS).
    logits: [N, V] float32, next-token logits after the row's last new token
      (the input logits for rows that emitted none).
    cache: the `KVCache` with row r's new tokens at slots
      [cache_index, cache_index + lengths[r]) and invalid slots after them.
  """
  tokens: Array
  logprobs: Array
  lengths: Array
  eos: Array
  stopped: Array
  logits: Array
  cache: Any


def _row_step_noise(rng, row_ids, row_steps, vocab_size):
  """Gumbel noise [N, K, V]: row r at step row_steps[r, k] draws from
  fold_in(fold_in(rng, r), step), the keys of `_gumbel_noise`."""
  def one(row, step):
    key = jax.random.fold_in(jax.random.fold_in(rng, row), step)
    return jax.random.gumbel(key, (vocab_size,), jnp.float32)
  return jax.vmap(lambda r, steps: jax.vmap(lambda g: one(r, g))(steps))(
      row_ids, row_steps)


@functools.partial(
    jax.jit,
    static_argnames=("cfg", "max_new_tokens", "eos_ids", "pad_id", "greedy",
                     "use_top_p", "num_tokens"))
def _jit_decode_from_cache(params, cache, logits, positions, cache_index,
                           budgets, noise_offsets, rng, temperature, top_p,
                           stop_mask, *, cfg, max_new_tokens, eos_ids, pad_id,
                           greedy, use_top_p, num_tokens):
  rows, new = logits.shape[0], max_new_tokens
  row_ids = jnp.arange(rows)
  choose = functools.partial(_choose_tokens, temperature=temperature,
                             top_p=top_p, greedy=greedy, use_top_p=use_top_p,
                             num_tokens=num_tokens)
  precompute = (not greedy and
                rows * new * cfg.vocab_size <= _PRECOMPUTED_NOISE_LIMIT)
  if precompute:
    all_noise = _row_step_noise(
        rng, row_ids, noise_offsets[:, None] + jnp.arange(new)[None, :],
        cfg.vocab_size)

  def noise_at(step):
    if greedy:
      return None
    if precompute:
      return jax.lax.dynamic_index_in_dim(all_noise, step, axis=1,
                                          keepdims=False)
    return _row_step_noise(rng, row_ids, (noise_offsets + step)[:, None],
                           cfg.vocab_size)[:, 0]

  # Loop state: (step t, logits for token t, rows done before t, outputs,
  # flags, cache). Unlike `sample`, every emitted token is fed to the model,
  # its end token included: the next turn continues from this cache.
  def body(state):
    step, logits, done, out_tokens, out_logp, eos, stopped, cache = state
    token, logp = choose(logits, noise_at(step))
    token = jnp.where(done, pad_id, token)
    logp = jnp.where(done, 0.0, logp)
    out_tokens = jax.lax.dynamic_update_slice(out_tokens, token[:, None],
                                              (0, step))
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None],
                                            (0, step))
    is_eos = ~done & _is_eos(token, eos_ids)
    is_stop = ~done & ~is_eos & stop_mask[token]
    eos, stopped = eos | is_eos, stopped | is_stop
    next_done = done | is_eos | is_stop | (step + 1 >= budgets)
    new_logits, cache = model_lib.apply(
        cfg, params, token[:, None], attention_mask=~done[:, None],
        positions=(positions + step)[:, None], cache=cache,
        cache_index=cache_index + step)
    logits = jnp.where(done[:, None], logits, new_logits[:, 0])
    return (step + 1, logits, next_done, out_tokens, out_logp, eos, stopped,
            cache)

  no_rows = jnp.zeros((rows,), bool)
  state = (jnp.int32(0), logits.astype(jnp.float32), budgets <= 0,
           jnp.full((rows, new), pad_id, jnp.int32),
           jnp.zeros((rows, new), jnp.float32), no_rows, no_rows, cache)
  state = jax.lax.while_loop(lambda s: (s[0] < new) & ~jnp.all(s[2]), body,
                             state)
  _, logits, _, out_tokens, out_logp, eos, stopped, cache = state
  lengths = jnp.minimum(jnp.maximum(budgets, 0), new)
  # A row's length: the steps before its end (or its whole budget).
  ends = _is_eos(out_tokens, eos_ids) | stop_mask[out_tokens]
  columns = jnp.arange(new)[None, :]
  first_end = jnp.min(jnp.where(ends & (columns < lengths[:, None]), columns,
                                new), axis=1)
  lengths = jnp.minimum(lengths, first_end + 1).astype(jnp.int32)
  return DecodeOutput(tokens=out_tokens, logprobs=out_logp, lengths=lengths,
                      eos=eos, stopped=stopped, logits=logits, cache=cache)


def decode_from_cache(cfg: config_lib.ModelConfig, params: Any,
                      cache: model_lib.KVCache, logits, positions,
                      cache_index, rng: Array, *, budgets,
                      noise_offsets=None, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0, eos_id,
                      pad_id: int, stop_mask=None,
                      num_tokens: Optional[int] = None) -> DecodeOutput:
  """Samples up to `max_new_tokens` more tokens per row from a filled cache.

  The continuation of `sample` for multi-turn episodes: row r's context is
  already in `cache` (its valid slots, ending before `cache_index`), its
  next-token logits are `logits[r]` and its next position `positions[r]`.
  Token t of row r is written at slot cache_index + t with position
  positions[r] + t, and, unlike in `sample`, every emitted token is fed to
  the model (the end token too), so the returned cache and logits continue
  the rows (e.g. after appending an observation). A row ends after an
  `eos_id` token, a `stop_mask` token, or `budgets[r]` tokens; rows with
  budget 0 emit nothing. Sampling is that of `sample`: the noise of row r's
  token t comes from fold_in(fold_in(rng, r), noise_offsets[r] + t), so
  with offsets 0 and the cache and logits of a prompt prefill this samples
  the tokens `sample` samples, and a row's tokens never depend on the other
  rows.

  Args:
    cfg: model configuration (static).
    params: parameters with an "lm" head.
    cache: the `KVCache`; slots [cache_index, cache_index + max_new_tokens)
      must exist (and are overwritten).
    logits: [N, V] next-token logits of every row.
    positions: [N] int, position id of every row's next token (its number
      of valid tokens so far).
    cache_index: int or int32 scalar, the first slot written.
    rng: PRNG key (unused for greedy decoding).
    budgets: [N] int, most tokens per row (clipped to [0, max_new_tokens]).
    noise_offsets: [N] int, row r's sampling step counter at its first
      token here (e.g. the tokens it sampled in earlier turns); default 0.
    max_new_tokens: G, output slots (static).
    temperature: 0 for greedy decoding, else the softmax temperature.
    top_p: nucleus mass in (0, 1].
    eos_id: id or ids that end a row (included in its tokens); None or ():
      none.
    pad_id: written after a row's end.
    stop_mask: optional bool [V]: tokens that end a row like EOS (e.g. the
      end-of-turn id); the row is then `stopped`.
    num_tokens: as in `sample`: ids >= num_tokens are never sampled.

  Returns:
    `DecodeOutput` with [N, G] tokens and log-probs.
  """
  logits = jnp.asarray(logits)
  rows = logits.shape[0] if logits.ndim == 2 else -1
  if logits.ndim != 2 or logits.shape[1] != cfg.vocab_size:
    raise ValueError(f"logits must be [N, {cfg.vocab_size}], got shape "
                     f"{logits.shape}.")
  if cache.key_mask.shape[0] != rows:
    raise ValueError(f"cache has {cache.key_mask.shape[0]} rows, logits "
                     f"{rows}.")
  if (isinstance(max_new_tokens, bool) or
      not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1):
    raise ValueError(f"max_new_tokens must be an int >= 1, got "
                     f"{max_new_tokens!r}.")
  if isinstance(cache_index, (int, np.integer)) and not (
      0 <= cache_index <= cache.max_len - max_new_tokens):
    raise ValueError(f"cache_index {cache_index} + max_new_tokens "
                     f"{max_new_tokens} does not fit a cache of "
                     f"{cache.max_len} slots.")
  arrays = {}
  for name, value in (("positions", positions), ("budgets", budgets),
                      ("noise_offsets", noise_offsets)):
    value = jnp.zeros((rows,), jnp.int32) if value is None else jnp.asarray(
        value)
    if value.shape != (rows,) or not jnp.issubdtype(value.dtype, jnp.integer):
      raise ValueError(f"{name} must be [N={rows}] ints, got shape "
                       f"{value.shape} dtype {value.dtype}.")
    arrays[name] = value.astype(jnp.int32)
  eos_ids, num_tokens = _check_sampling(cfg, temperature, top_p, eos_id,
                                        pad_id, num_tokens)
  if stop_mask is None:
    stop_mask = jnp.zeros((cfg.vocab_size,), bool)
  stop_mask = jnp.asarray(stop_mask)
  if stop_mask.shape != (cfg.vocab_size,):
    raise ValueError(f"stop_mask must have shape ({cfg.vocab_size},), got "
                     f"{stop_mask.shape}.")
  greedy = float(temperature) == 0.0
  return _jit_decode_from_cache(
      params, cache, logits, arrays["positions"],
      jnp.asarray(cache_index, jnp.int32), arrays["budgets"],
      arrays["noise_offsets"], rng,
      jnp.float32(1.0 if greedy else temperature), jnp.float32(top_p),
      stop_mask.astype(bool), cfg=cfg, max_new_tokens=int(max_new_tokens),
      eos_ids=eos_ids, pad_id=int(pad_id), greedy=greedy,
      use_top_p=(not greedy) and float(top_p) < 1.0, num_tokens=num_tokens)
