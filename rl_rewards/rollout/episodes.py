"""Multi-turn episodes: the policy and an environment take turns in one row.

    envs = BatchedEnv(hidden_operands.HiddenOperandsEnv)
    out = sample_episodes(cfg, params, envs, problems, tokenizer, rng,
                          max_prompt_len=16, max_episode_tokens=96,
                          max_turns=8, max_turn_tokens=16,
                          max_observation_tokens=8,
                          end_of_turn_ids=[newline_id])

`envs.reset(problems)` gives the prompts, which are prefilled once. Each turn
the policy samples until an end-of-turn id (a stop token), an EOS, its turn
budget or the context runs out (`sampler.decode_from_cache`); the turn's
text goes to `envs.step`, and the observation's tokens are prefilled into
the same KV cache, after which the policy goes on. An episode ends when the
environment says done, the policy emits EOS (the environment still scores
that turn), after `max_turns` turns, or when the next observation (plus one
policy token) no longer fits `max_episode_tokens`. A final observation
(after a done turn) is not appended, so every episode ends on a policy token.

The tokens trained on are the tokens sampled: a turn's ids are copied into
the output as they were sampled; its text is decoded only to give the
environment its action, and only observations are encoded. The cache keeps
every token of a live row across turns. Rows end turns at different times,
which leaves empty slots in the cache; before each prefill and each turn the
cache is repacked (`models.model.repack_cache`) so that every live row is
contiguous and ends at one slot, the layout of a left-padded prompt, and
the next tokens go on from there. Cache sizes come from a few buckets (as in
the sampler's segmented decoding), so a batch compiles a handful of
programs whatever the episode lengths.

Output layout: the sampler's `[B, P + G]` (G = `max_episode_tokens`): the
left-padded prompt in the first P columns, then the episode — turns and
observations alternating, contiguous — then padding. `response_mask` is 1 on
the policy's tokens only (observations are context: never trained on,
never in the KL, entropies or any scorer); `turn_ids` are the policy turn of
each policy token and −1 elsewhere (prompt, observations, padding), the
convention of `step_ids` in `core.segments` (turn k ends at its last policy
token), so every step-level function works per turn.

`continue_episodes` goes on from given first turns of each row (e.g. to
roll out a sampled episode's turn prefixes for Monte-Carlo turn labels): the
environment's state is restored by replaying those turns through the
freshly reset environment (a deterministic environment is required), the
prompt and the prefix are prefilled into the cache, and the policy samples
the turns after them.

Randomness: the noise of row r's i-th policy token (counted over the whole
episode) comes from fold_in(fold_in(rng, r), i), as in `sampler.sample`, so
the first turn samples what `sample` samples with the same stop tokens, the
same rng gives the same episodes, and a row's episode does not depend on
the other rows of the batch.
"""

import functools
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_rewards import errors
from rl_rewards import kill_points
from rl_rewards.envs import batched
from rl_rewards.models import config as config_lib
from rl_rewards.models import model as model_lib
from rl_rewards.rollout import sampler
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib

# Observation widths are rounded up to a power of two, at least this.
_MIN_OBSERVATION_WIDTH = 8


class EpisodeOutput(NamedTuple):
  """A batch of episodes, host-side (numpy), batch-first, length P + G.

  Attributes:
    tokens: [B, P+G] int32: prompt, then policy turns and observations,
      then `pad_id`.
    attention_mask: [B, P+G] int32, 1 on prompt, policy and observation
      tokens.
    response_mask: [B, P+G] int32, 1 on policy-sampled tokens only.
    observation_mask: [B, P+G] int32, 1 on observation tokens.
    logprobs: [B, P+G] float32, log pi(token) of policy tokens (untempered,
      as `SampleOutput.logprobs`), 0 elsewhere.
    turn_ids: [B, P+G] int32, the turn of each policy token, −1 elsewhere.
    lengths: [B] int32, episode tokens after the prompt (policy and
      observations).
    num_turns: [B] int32, policy turns of each episode.
    turn_rewards: [B, max_turns] float32, the environment's reward after
      each turn (0 on turns that did not happen).
    turn_mask: [B, max_turns] bool, True on the turns that happened.
    turn_truncated: [B, max_turns] bool, the turn ran out of tokens
      (`max_turn_tokens` or the context) before an end-of-turn id or EOS.
    done: [B] bool, the environment ended the episode.
    eos: [B] bool, the policy ended it with an EOS id.
    truncated: [B] bool, the context (`max_episode_tokens`) ended it.
    actions: B lists, the text of each turn as the environment got it.
    observations: B lists, the observation text after each turn ("" where
      none was appended; the text before any cut to
      `max_observation_tokens`).
    infos: B lists, the environment's info dict of each turn.
    env_stats: the environment's `EnvStats` after the episodes.
    observations_cut: observations cut to `max_observation_tokens`.
  """
  tokens: np.ndarray
  attention_mask: np.ndarray
  response_mask: np.ndarray
  observation_mask: np.ndarray
  logprobs: np.ndarray
  turn_ids: np.ndarray
  lengths: np.ndarray
  num_turns: np.ndarray
  turn_rewards: np.ndarray
  turn_mask: np.ndarray
  turn_truncated: np.ndarray
  done: np.ndarray
  eos: np.ndarray
  truncated: np.ndarray
  actions: List[List[str]]
  observations: List[List[str]]
  infos: List[List[dict]]
  env_stats: batched.EnvStats
  observations_cut: int


def cache_sizes(prompt_len: int, max_episode_tokens: int,
                margin: int) -> tuple[int, ...]:
  """The cache sizes episodes use: P + e + margin for the sampler's segment
  ends e (`sampler.decode_segment_ends`), so short episodes never pay for
  the longest cache."""
  return tuple(prompt_len + e + margin
               for e in sampler.decode_segment_ends(max_episode_tokens))


def _bucket(sizes, needed):
  for size in sizes:
    if size >= needed:
      return size
  raise AssertionError(f"no cache size >= {needed} in {sizes}")


def _observation_width(longest: int, limit: int) -> int:
  width = _MIN_OBSERVATION_WIDTH
  while width < longest:
    width *= 2
  return min(width, max(limit, 1))


def _check_int(name, value, minimum):
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or
      value < minimum):
    raise errors.InputError(f"{name} must be an int >= {minimum}, got "
                            f"{value!r}.")
  return int(value)


@functools.partial(jax.jit, static_argnames=("max_len",))
def _repack(cache, keep, end, *, max_len):
  """The rows in `keep`, repacked to end at `end`; other rows emptied."""
  cache = cache._replace(key_mask=cache.key_mask & keep[:, None])
  return model_lib.repack_cache(cache, end, max_len)


@functools.partial(jax.jit, static_argnames=("cfg", "max_len"))
def _append_observations(params, cache, logits, keep, obs_tokens, obs_mask,
                         end, *, cfg, max_len):
  """Repacks the rows in `keep` to end at `end`, prefills the left-padded
  observations [B, O] at slots [end, end + O), and returns the next-token
  logits (unchanged for rows without an observation) and the cache.

  The observation's left padding leaves empty slots between a row's
  context and its observation, so sliding windows are measured in
  positions, not slots (`sliding_by_position`); the next repack closes the
  gap."""
  cache = _repack(cache, keep, end, max_len=max_len)
  new_logits, cache = model_lib.apply(
      cfg, params, obs_tokens, attention_mask=obs_mask, cache=cache,
      cache_index=end, last_only=True, sliding_by_position=True)
  has_observation = jnp.any(obs_mask, axis=1)
  return jnp.where(has_observation[:, None], new_logits[:, 0], logits), cache


def sample_episodes(cfg: config_lib.ModelConfig, params: Any,
                    env: batched.BatchedEnv, problems: Sequence[Any],
                    tokenizer: tokenizer_lib.Tokenizer, rng: jax.Array, *,
                    max_prompt_len: int, max_episode_tokens: int,
                    max_turns: int, max_turn_tokens: int,
                    max_observation_tokens: int,
                    end_of_turn_ids: Sequence[int],
                    eos_id=None, pad_id: Optional[int] = None,
                    temperature: float = 1.0, top_p: float = 1.0,
                    num_tokens: Optional[int] = None,
                    encode_observation: Optional[Callable[[str],
                                                          List[int]]] = None
                    ) -> EpisodeOutput:
  """Samples one episode per problem (see the module docstring).

  Args:
    cfg: model configuration.
    params: policy parameters with an "lm" head.
    env: the `BatchedEnv`; reset here with `problems`.
    problems: B problems (the rows; repeat a problem n times, contiguously,
      for a group of n samples).
    tokenizer: encodes the prompts (`tokenizer.encode_prompts`) and the
      observations, decodes each turn for the environment.
    rng: PRNG key (unused for greedy decoding).
    max_prompt_len: P, the prompt width (longer prompts raise).
    max_episode_tokens: G, slots after the prompt for turns and
      observations; P + G must fit the model's context.
    max_turns: most policy turns per episode.
    max_turn_tokens: most tokens per policy turn.
    max_observation_tokens: observations are cut to this many tokens.
    end_of_turn_ids: ids that end a turn (e.g. the newline of a one-line
      tool call, or a chat template's end-of-turn token).
    eos_id: ids that end the episode; default the tokenizer's `stop_ids`
      that are not end-of-turn ids.
    pad_id: padding id; default the tokenizer's.
    temperature: 0 for greedy decoding, else the softmax temperature.
    top_p: nucleus mass in (0, 1].
    num_tokens: ids >= num_tokens are never sampled (default the
      tokenizer's vocab_size when the model's embedding is larger).
    encode_observation: observation text -> ids (default
      `tokenizer.encode`), e.g. to wrap it in a chat template's user turn.

  Returns:
    The `EpisodeOutput`.
  """
  return _run_episodes(
      cfg, params, env, problems, tokenizer, rng, None,
      max_prompt_len=max_prompt_len, max_episode_tokens=max_episode_tokens,
      max_turns=max_turns, max_turn_tokens=max_turn_tokens,
      max_observation_tokens=max_observation_tokens,
      end_of_turn_ids=end_of_turn_ids, eos_id=eos_id, pad_id=pad_id,
      temperature=temperature, top_p=top_p, num_tokens=num_tokens,
      encode_observation=encode_observation)


def continue_episodes(cfg: config_lib.ModelConfig, params: Any,
                      env: batched.BatchedEnv, problems: Sequence[Any],
                      prefix_turns: Sequence[Sequence[Sequence[int]]],
                      tokenizer: tokenizer_lib.Tokenizer, rng: jax.Array,
                      **kwargs) -> EpisodeOutput:
  """Episodes that go on from given first turns (the keyword arguments are
  `sample_episodes`').

  Row r's first k turns are `prefix_turns[r]` (token ids, e.g. a sampled
  episode's turns); the policy samples the turns after them. The
  environment's state after the prefix is restored by replaying it:
  `env.reset(problems)`, then `env.step` with the decoded text of each
  prefix turn in order, whose observations are encoded and appended as
  `sample_episodes` appends them. This restores the state only for a
  deterministic environment (the same actions after the same reset give the
  same observations, rewards and state), which is what this function
  requires; a caller can check it by comparing the returned prefix tokens
  with the original episode's. The prompt and the prefix (turns and
  observations) are prefilled into the KV cache, and decoding goes on from
  there.

  Every row has the same number k of prefix turns (the replay steps the
  batched environment in lock step; k = 0 is `sample_episodes`), and no
  prefix turn may end the episode (an EOS id, or a step the environment
  calls done): a prefix stops where its episode went on. Row r's noise
  offsets start after its prefix's policy tokens, as if it had sampled
  them. In the output the prefix's turns are the episode's first k turns
  (their `logprobs` are 0: they were not sampled here), with the replayed
  rewards, infos and observations.

  Raises:
    InputError: rows with different k, k >= `max_turns`, a prefix turn
      with no tokens or more than `max_turn_tokens`, a prefix that ends its
      episode or leaves no room for another turn.
  """
  return _run_episodes(cfg, params, env, problems, tokenizer, rng,
                       prefix_turns, **kwargs)


def _replay_prefixes(env, prefix_turns, tokenizer, *, batch, total,
                     turn_tokens, obs_limit, end_of_turn_ids, eos_ids,
                     encode):
  """Steps `env` (just reset) with every row's prefix turns.

  Returns:
    (k, per-row episode token lists, per-row turn id lists (−1 on
    observations), actions, observations, infos, [B, k] rewards, [B, k]
    turns without an end-of-turn id, observations cut).
  """
  prefix_turns = [[[int(t) for t in turn] for turn in row]
                  for row in prefix_turns]
  if len(prefix_turns) != batch:
    raise errors.InputError(f"got {len(prefix_turns)} prefixes for {batch} "
                            "problems.")
  k = len(prefix_turns[0])
  for row, turns in enumerate(prefix_turns):
    if len(turns) != k:
      raise errors.InputError(
          f"prefix row {row} has {len(turns)} turns, row 0 has {k}: every "
          "row of a call continues after the same number of turns.")
    for j, ids in enumerate(turns):
      if not 1 <= len(ids) <= turn_tokens:
        raise errors.InputError(
            f"prefix row {row}, turn {j}: {len(ids)} tokens; a turn has 1 to "
            f"max_turn_tokens={turn_tokens}.")
      if set(ids) & set(eos_ids):
        raise errors.InputError(
            f"prefix row {row}, turn {j} holds an EOS id, which ends the "
            "episode: a prefix stops before its episode's end.")
  tokens = [[] for _ in range(batch)]
  turn_ids = [[] for _ in range(batch)]
  actions = [[] for _ in range(batch)]
  observations = [[] for _ in range(batch)]
  infos = [[] for _ in range(batch)]
  rewards = np.zeros((batch, k), np.float32)
  unended = np.zeros((batch, k), bool)
  cut = 0
  for j in range(k):
    texts = []
    for row in range(batch):
      ids = prefix_turns[row][j]
      tokens[row].extend(ids)
      turn_ids[row].extend([j] * len(ids))
      texts.append(tokenizer.decode(np.asarray(ids, np.int32),
                                    errors="replace"))
      actions[row].append(texts[-1])
      unended[row, j] = ids[-1] not in end_of_turn_ids
    result = env.step(texts)
    rewards[:, j] = result.rewards
    for row in range(batch):
      infos[row].append(result.infos[row])
      if result.dones[row]:
        raise errors.InputError(
            f"prefix row {row}: the environment ended the episode at turn "
            f"{j} of its prefix; a prefix stops before its episode's end.")
      text = result.observations[row]
      ids = list(encode(text)) if text else []
      if len(ids) > obs_limit:
        ids = ids[:obs_limit]
        cut += 1
      if len(tokens[row]) + len(ids) + 1 > total:
        raise errors.InputError(
            f"prefix row {row}: its {j + 1} turns and observations leave no "
            f"room for another turn in max_episode_tokens={total}.")
      tokens[row].extend(ids)
      turn_ids[row].extend([-1] * len(ids))
      observations[row].append(text if ids else "")
  return (k, tokens, turn_ids, actions, observations, infos, rewards,
          unended, cut)


def _run_episodes(cfg, params, env, problems, tokenizer, rng, prefix_turns,
                  *, max_prompt_len, max_episode_tokens, max_turns,
                  max_turn_tokens, max_observation_tokens, end_of_turn_ids,
                  eos_id=None, pad_id=None, temperature=1.0, top_p=1.0,
                  num_tokens=None, encode_observation=None):
  """`sample_episodes`, or `continue_episodes` with `prefix_turns`."""
  problems = list(problems)
  batch = len(problems)
  if batch == 0:
    raise errors.InputError("sample_episodes needs at least one problem.")
  prompt_len = _check_int("max_prompt_len", max_prompt_len, 1)
  total = _check_int("max_episode_tokens", max_episode_tokens, 1)
  max_turns = _check_int("max_turns", max_turns, 1)
  turn_tokens = _check_int("max_turn_tokens", max_turn_tokens, 1)
  obs_limit = _check_int("max_observation_tokens", max_observation_tokens, 0)
  if prompt_len + total > cfg.max_position_embeddings:
    raise errors.InputError(
        f"max_prompt_len {prompt_len} + max_episode_tokens {total} exceeds "
        f"the model context (max_position_embeddings="
        f"{cfg.max_position_embeddings}).")
  end_of_turn_ids = tuple(int(i) for i in end_of_turn_ids)
  if not end_of_turn_ids:
    raise errors.InputError("end_of_turn_ids must name at least one id.")
  if eos_id is None:
    eos_id = tuple(i for i in tokenizer.stop_ids if i not in end_of_turn_ids)
  eos_ids = segmentation.eos_id_tuple(eos_id)
  if set(eos_ids) & set(end_of_turn_ids):
    raise errors.InputError(
        f"eos ids {eos_ids} and end_of_turn_ids {end_of_turn_ids} overlap: an "
        "id either ends the turn or the episode.")
  pad_id = tokenizer.pad_id if pad_id is None else pad_id
  if num_tokens is None and tokenizer.vocab_size < cfg.vocab_size:
    num_tokens = tokenizer.vocab_size
  stop_mask = np.zeros((cfg.vocab_size,), bool)
  for i in end_of_turn_ids:
    if not 0 <= i < cfg.vocab_size:
      raise errors.InputError(f"end_of_turn id {i} is outside the "
                              f"vocabulary [0, {cfg.vocab_size}).")
    stop_mask[i] = True
  encode = encode_observation or tokenizer.encode

  first = env.reset(problems)
  if len(first) != batch:
    raise errors.InputError(f"env.reset returned {len(first)} observations "
                            f"for {batch} problems.")
  prompt_tokens, prompt_mask = tokenizer_lib.encode_prompts(
      tokenizer, first, prompt_len)
  margin = max(turn_tokens, _observation_width(obs_limit, obs_limit))
  sizes = cache_sizes(prompt_len, total, margin)

  cache = model_lib.init_cache(cfg, batch, _bucket(sizes,
                                                   prompt_len + turn_tokens))
  logits, cache = model_lib.apply(
      cfg, params, prompt_tokens, attention_mask=prompt_mask.astype(bool),
      cache=cache, cache_index=0, last_only=True)
  logits = logits[:, 0]

  # Host bookkeeping, per row.
  valid = prompt_mask.sum(axis=1).astype(np.int64)  # Tokens in the cache.
  used = np.zeros((batch,), np.int64)  # Episode tokens so far.
  sampled = np.zeros((batch,), np.int64)  # Policy tokens (noise offsets).
  live = np.ones((batch,), bool)
  end = prompt_len  # Every live row's context ends before this slot.
  row_tokens = [[] for _ in range(batch)]
  row_logprobs = [[] for _ in range(batch)]
  row_turn = [[] for _ in range(batch)]  # Turn id, or -1 on observations.
  turn_rewards = np.zeros((batch, max_turns), np.float32)
  turn_mask = np.zeros((batch, max_turns), bool)
  turn_truncated = np.zeros((batch, max_turns), bool)
  done = np.zeros((batch,), bool)
  ended_on_eos = np.zeros((batch,), bool)
  truncated = np.zeros((batch,), bool)
  actions = [[] for _ in range(batch)]
  observations = [[] for _ in range(batch)]
  infos = [[] for _ in range(batch)]
  observations_cut = 0
  first_turn = 0

  if prefix_turns is not None:
    (first_turn, row_tokens, row_turn, actions, observations, infos,
     prefix_rewards, prefix_unended, observations_cut) = _replay_prefixes(
         env, prefix_turns, tokenizer, batch=batch, total=total,
         turn_tokens=turn_tokens, obs_limit=obs_limit,
         end_of_turn_ids=end_of_turn_ids, eos_ids=eos_ids, encode=encode)
    if first_turn >= max_turns:
      raise errors.InputError(
          f"prefixes of {first_turn} turns leave no turn of max_turns="
          f"{max_turns}.")
    turn_rewards[:, :first_turn] = prefix_rewards
    turn_mask[:, :first_turn] = True
    turn_truncated[:, :first_turn] = prefix_unended
    row_logprobs = [[0.0] * len(ids) for ids in row_tokens]
    lengths = np.array([len(ids) for ids in row_tokens], np.int64)
    sampled += np.array([sum(t >= 0 for t in ids) for ids in row_turn],
                        np.int64)
    if lengths.max() > 0:
      # The whole prefix (turns and observations) in one prefill,
      # left-padded as an observation is.
      width = min(_observation_width(int(lengths.max()), total), total)
      chunk = np.full((batch, width), pad_id, np.int32)
      chunk_mask = np.zeros((batch, width), bool)
      for row, ids in enumerate(row_tokens):
        chunk[row, width - len(ids):] = ids
        chunk_mask[row, width - len(ids):] = True
      logits, cache = _append_observations(
          params, cache, logits, live, chunk, chunk_mask, np.int32(end),
          cfg=cfg, max_len=_bucket(sizes, end + width))
      valid += lengths
      used += lengths

  for turn in range(first_turn, max_turns):
    if not live.any():
      break
    if turn > 0:
      kill_points.point("episodes.turn")  # Between two turns of a batch.
      end = int(valid[live].max())
      cache = _repack(cache, live, np.int32(end),
                      max_len=_bucket(sizes, end + turn_tokens))
    budgets = np.where(live, np.minimum(turn_tokens, total - used), 0)
    out = sampler.decode_from_cache(
        cfg, params, cache, logits, valid.astype(np.int32), end,
        rng,
        budgets=budgets.astype(np.int32),
        noise_offsets=sampled.astype(np.int32), max_new_tokens=turn_tokens,
        temperature=temperature, top_p=top_p, eos_id=eos_ids, pad_id=pad_id,
        stop_mask=stop_mask, num_tokens=num_tokens)
    cache, logits = out.cache, out.logits
    tokens, logprobs, lengths, eos, stopped = jax.device_get(
        (out.tokens, out.logprobs, out.lengths, out.eos, out.stopped))
    step_actions = [None] * batch
    for row in np.nonzero(live)[0]:
      n = int(lengths[row])
      ids = tokens[row, :n]
      row_tokens[row].extend(ids.tolist())
      row_logprobs[row].extend(logprobs[row, :n].tolist())
      row_turn[row].extend([turn] * n)
      step_actions[row] = tokenizer.decode(ids, errors="replace")
      actions[row].append(step_actions[row])
      turn_truncated[row, turn] = not (eos[row] or stopped[row])
    valid += lengths
    used += lengths
    sampled += lengths
    result = env.step(step_actions)
    turn_rewards[live, turn] = result.rewards[live]
    turn_mask[live, turn] = True
    for row in np.nonzero(live)[0]:
      infos[row].append(result.infos[row])
    done |= live & result.dones
    ended_on_eos |= live & eos
    # Who goes on, and with which observation.
    going_on = live & ~result.dones & ~eos & (turn + 1 < max_turns)
    observation_ids = [[] for _ in range(batch)]
    for row in np.nonzero(live)[0]:
      text = result.observations[row] if going_on[row] else ""
      ids = list(encode(text)) if text else []
      if len(ids) > obs_limit:
        ids = ids[:obs_limit]
        observations_cut += 1
      if going_on[row] and used[row] + len(ids) + 1 > total:
        going_on[row] = False  # No room for the observation and a turn.
        truncated[row] = True
        ids, text = [], ""
      observation_ids[row] = ids
      observations[row].append(text if ids else "")
    env.end_rows(~going_on)
    live = going_on
    obs_lengths = np.array([len(ids) for ids in observation_ids])
    if live.any() and obs_lengths.max() > 0:
      width = _observation_width(int(obs_lengths.max()), obs_limit)
      end = int(valid[live].max())
      obs_tokens = np.full((batch, width), pad_id, np.int32)
      obs_mask = np.zeros((batch, width), bool)
      for row in np.nonzero(live & (obs_lengths > 0))[0]:
        ids = observation_ids[row]
        obs_tokens[row, width - len(ids):] = ids  # Left-padded.
        obs_mask[row, width - len(ids):] = True
        row_tokens[row].extend(ids)
        row_logprobs[row].extend([0.0] * len(ids))
        row_turn[row].extend([-1] * len(ids))
      logits, cache = _append_observations(
          params, cache, logits, live, obs_tokens, obs_mask, np.int32(end),
          cfg=cfg, max_len=_bucket(sizes, end + width))
      valid += obs_lengths
      used += obs_lengths

  # The sampler's layout: prompt columns, then each row's episode.
  width = prompt_len + total
  tokens = np.full((batch, width), pad_id, np.int32)
  tokens[:, :prompt_len] = prompt_tokens
  attention_mask = np.zeros((batch, width), np.int32)
  attention_mask[:, :prompt_len] = prompt_mask
  logprobs = np.zeros((batch, width), np.float32)
  turn_ids = np.full((batch, width), -1, np.int32)
  for row in range(batch):
    n = len(row_tokens[row])
    span = slice(prompt_len, prompt_len + n)
    tokens[row, span] = row_tokens[row]
    attention_mask[row, span] = 1
    logprobs[row, span] = row_logprobs[row]
    turn_ids[row, span] = row_turn[row]
  response_mask = (turn_ids >= 0).astype(np.int32)
  observation_mask = attention_mask * (1 - response_mask)
  observation_mask[:, :prompt_len] = 0
  return EpisodeOutput(
      tokens=tokens, attention_mask=attention_mask,
      response_mask=response_mask, observation_mask=observation_mask,
      logprobs=logprobs, turn_ids=turn_ids,
      lengths=used.astype(np.int32),
      num_turns=turn_mask.sum(axis=1).astype(np.int32),
      turn_rewards=turn_rewards, turn_mask=turn_mask,
      turn_truncated=turn_truncated, done=done, eos=ended_on_eos,
      truncated=truncated, actions=actions, observations=observations,
      infos=infos, env_stats=env.stats, observations_cut=observations_cut)
