"""Tests of multi-turn episodes on the hidden-operands task with a tiny
random policy: cache reuse against full forward passes, masks and turn ids,
no re-tokenisation, determinism, the mesh."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import errors
from rl_rewards import models
from rl_rewards.core import segments
from rl_rewards.envs import batched
from rl_rewards.models import model as model_lib
from rl_rewards.rollout import episodes
from rl_rewards.rollout import sampler
from rl_rewards.sharding import axes
from rl_rewards.tasks import arith
from rl_rewards.tasks import hidden_operands as ho
from rl_rewards.tasks import tokenizer as tokenizer_lib

# Extra ids that decode to these characters; `encode` never produces them.
ALIASES = "0+x\n"


class AliasTokenizer(tokenizer_lib.CharTokenizer):
  """The task's tokenizer plus ids 24..27 that decode like "0", "+", "x",
  "\\n": decode -> encode maps them to other ids, so a rollout that
  re-encoded the policy's text would lose them."""

  def __init__(self):
    super().__init__(ho.ALPHABET)
    self.alias_ids = list(range(self.vocab_size,
                                self.vocab_size + len(ALIASES)))
    self._id_to_char = self._id_to_char + list(ALIASES)
    self.vocab_size += len(ALIASES)


TOKENIZER = AliasTokenizer()
CFG = models.preset("test", TOKENIZER.vocab_size)  # V = 28.
NEWLINE = TOKENIZER.encode("\n")[0]
TASK = ho.HiddenOperandsConfig(
    chains=arith.ArithConfig(min_ops=2, max_ops=3), num_distractors=1)
PROMPT_LEN, TOTAL, TURNS, TURN_TOKENS, OBS = 16, 48, 5, 8, 8
KWARGS = dict(max_prompt_len=PROMPT_LEN, max_episode_tokens=TOTAL,
              max_turns=TURNS, max_turn_tokens=TURN_TOKENS,
              max_observation_tokens=OBS,
              end_of_turn_ids=[NEWLINE, TOKENIZER.alias_ids[-1]])


def _problems(indices):
  return ho.make_problems(TASK, "train", indices)


def _run(params, problems, rng, cfg=CFG, **overrides):
  env = batched.BatchedEnv(ho.HiddenOperandsEnv)
  return episodes.sample_episodes(cfg, params, env, problems, TOKENIZER, rng,
                                  **{**KWARGS, **overrides})


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0))


@pytest.fixture(scope="module")
def sampled(params):
  return _run(params, _problems(range(8)), jax.random.key(3))


def _full_forward_logprobs(params, out):
  return np.asarray(models.token_logprobs(CFG, params, out.tokens,
                                          out.attention_mask))


class TestCacheReuse:

  def test_logprobs_equal_a_full_prefill_of_the_episode(self, params,
                                                        sampled):
    # Every policy token's log-prob, computed with the cache kept across
    # turns (observations prefilled, cache repacked), equals the one of a
    # forward pass over the whole finished episode.
    assert sampled.observation_mask.sum() > 0  # Observations were appended.
    assert (sampled.num_turns > 1).any()
    mask = sampled.response_mask.astype(bool)
    np.testing.assert_allclose(_full_forward_logprobs(params, sampled)[mask],
                               sampled.logprobs[mask], atol=2e-5)

  def test_sliding_window_layers_see_the_same_window(self):
    # An observation is left-padded, which leaves empty slots between a
    # row's context and its observation; sliding windows must still cover
    # the same tokens as in the contiguous episode.
    cfg = CFG.replace(layer_types=("sliding",) * CFG.num_layers,
                      sliding_window=6)
    params = models.init_params(cfg, jax.random.key(0))
    out = _run(params, _problems(range(8)), jax.random.key(3), cfg=cfg,
               max_turns=3)
    assert out.observation_mask.sum() > 0
    mask = out.response_mask.astype(bool)
    logprobs = np.asarray(models.token_logprobs(cfg, params, out.tokens,
                                                out.attention_mask))
    np.testing.assert_allclose(logprobs[mask], out.logprobs[mask], atol=2e-5)

  @pytest.mark.slow  # A second decoding program; the log-prob test above
  # already ties every sampled token to a full forward pass.
  def test_greedy_tokens_are_the_argmax_of_a_full_forward(self, params):
    out = _run(params, _problems(range(6, 10)), jax.random.key(0),
               temperature=0.0)
    logits = np.asarray(models.apply(CFG, params, out.tokens,
                                     attention_mask=out.attention_mask)[0])
    rows, cols = np.nonzero(out.response_mask)
    np.testing.assert_array_equal(out.tokens[rows, cols],
                                  logits[rows, cols - 1].argmax(-1))

  def test_first_turn_is_what_the_sampler_samples(self, params, sampled):
    # Same noise keys: fold_in(fold_in(rng, row), token index).
    problems = _problems(range(8))
    prompts, mask = tokenizer_lib.encode_prompts(
        TOKENIZER, [p.question for p in problems], PROMPT_LEN)
    stop = np.zeros(CFG.vocab_size, bool)
    stop[KWARGS["end_of_turn_ids"]] = True
    ref = sampler.sample(CFG, params, prompts, mask, jax.random.key(3),
                         max_new_tokens=TURN_TOKENS, eos_id=TOKENIZER.eos_id,
                         pad_id=TOKENIZER.pad_id, stop_mask=stop)
    first = (sampled.turn_ids == 0)
    for row in range(8):
      n = int(ref.lengths[row])
      np.testing.assert_array_equal(
          sampled.tokens[row][first[row]],
          np.asarray(ref.tokens)[row, PROMPT_LEN:PROMPT_LEN + n])


class TestLayout:

  def test_masks_turn_ids_and_rewards(self, sampled):
    out = sampled
    response = out.response_mask.astype(bool)
    observation = out.observation_mask.astype(bool)
    assert not (response & observation).any()
    np.testing.assert_array_equal(response, out.turn_ids >= 0)
    np.testing.assert_array_equal(out.logprobs[~response], 0.0)
    assert (out.logprobs[response] < 0).all()
    # Prompt, then a contiguous episode of `lengths` tokens.
    episode = out.attention_mask[:, PROMPT_LEN:].astype(bool)
    np.testing.assert_array_equal(
        episode, np.arange(TOTAL)[None] < out.lengths[:, None])
    np.testing.assert_array_equal(response | observation,
                                  np.pad(episode, ((0, 0), (PROMPT_LEN, 0))))
    # turn_ids follow the step_ids convention: turn k's tokens are
    # contiguous, and core.segments sees one step per turn.
    counts = np.asarray(segments.step_token_counts(out.turn_ids, TURNS))
    np.testing.assert_array_equal(
        np.asarray(segments.num_steps_per_row(out.turn_ids)), out.num_turns)
    for row in range(len(out.actions)):
      ids = out.turn_ids[row]
      for k in range(out.num_turns[row]):
        where = np.nonzero(ids == k)[0]
        assert where.size and np.all(np.diff(where) == 1)
        assert counts[row, k] == where.size <= TURN_TOKENS
        # The turn's last token ends it (end-of-turn or EOS) or it ran out.
        last = out.tokens[row, where[-1]]
        ended = last in KWARGS["end_of_turn_ids"] or last == TOKENIZER.eos_id
        assert ended != out.turn_truncated[row, k]
    ends = np.asarray(segments.step_end_mask_from_ids(out.turn_ids))
    np.testing.assert_array_equal(ends.sum(1), out.num_turns)
    np.testing.assert_array_equal(out.turn_mask.sum(1), out.num_turns)
    np.testing.assert_array_equal(out.turn_rewards[~out.turn_mask], 0.0)

  def test_observations_are_the_encoded_environment_text(self, sampled):
    out = sampled
    for row in range(len(out.actions)):
      expected = []
      for k, text in enumerate(out.observations[row]):
        expected += TOKENIZER.encode(text)
        # The environment's reply to the turn (appended unless the
        # episode ended there).
        if text:
          assert k + 1 < out.num_turns[row]
      got = out.tokens[row][out.observation_mask[row].astype(bool)]
      np.testing.assert_array_equal(got, expected)

  def test_environment_labels_equal_the_oracle(self, sampled):
    problems = _problems(range(8))
    labels, mask = ho.oracle_turn_labels(problems, sampled.actions, TURNS)
    np.testing.assert_array_equal(mask, sampled.turn_mask)
    from_env = np.zeros_like(labels)
    for row, infos in enumerate(sampled.infos):
      from_env[row, :len(infos)] = [i["progress"] for i in infos]
    np.testing.assert_array_equal(labels, from_env)
    # Per-turn labels reach the policy's tokens only, through turn_ids.
    on_tokens = np.asarray(segments.steps_to_tokens(labels,
                                                    sampled.turn_ids))
    assert not on_tokens[sampled.response_mask == 0].any()
    np.testing.assert_array_equal(
        np.asarray(segments.tokens_to_steps(on_tokens, sampled.turn_ids,
                                            TURNS, reduce="last")), labels)

  def test_sampled_tokens_are_kept_not_reencoded(self, params, sampled):
    # The policy samples alias ids, which decode -> encode would replace;
    # they stay in the output, with the log-probs they were sampled with.
    policy = sampled.tokens[sampled.response_mask.astype(bool)]
    aliases = np.isin(policy, TOKENIZER.alias_ids)
    assert aliases.any()
    for row, actions in enumerate(sampled.actions):
      ids = sampled.tokens[row][sampled.response_mask[row].astype(bool)]
      if np.isin(ids, TOKENIZER.alias_ids).any():
        # This row's text does not encode back to its tokens.
        kept = [i for i in ids.tolist() if i != TOKENIZER.eos_id]
        assert TOKENIZER.encode("".join(actions)) != kept


class TestDeterminism:

  def test_same_rng_same_episodes_and_rows_independent(self, params,
                                                       sampled):
    again = _run(params, _problems(range(8)), jax.random.key(3))
    np.testing.assert_array_equal(again.tokens, sampled.tokens)
    # Rows 0-2 keep their episodes when the other rows change.
    mixed = _run(params, _problems([0, 1, 2, 40, 41, 42, 43, 44]),
                 jax.random.key(3))
    np.testing.assert_array_equal(mixed.tokens[:3], sampled.tokens[:3])
    np.testing.assert_allclose(mixed.logprobs[:3], sampled.logprobs[:3],
                               atol=1e-5)
    assert mixed.actions[:3] == sampled.actions[:3]


class TestDecodeFromCache:

  def test_budgets_cut_rows_and_idle_rows_keep_their_logits(self, params):
    problems = _problems(range(8))
    prompts, mask = tokenizer_lib.encode_prompts(
        TOKENIZER, [p.question for p in problems], PROMPT_LEN)
    size = episodes.cache_sizes(PROMPT_LEN, TOTAL, TURN_TOKENS)[0]
    logits, cache = models.apply(
        CFG, params, prompts, attention_mask=mask.astype(bool),
        cache=models.init_cache(CFG, 8, size), cache_index=0, last_only=True)
    logits = logits[:, 0]

    def decode(budgets):
      return sampler.decode_from_cache(
          CFG, params, cache, logits, mask.sum(1), PROMPT_LEN,
          jax.random.key(5), budgets=np.array(budgets, np.int32),
          max_new_tokens=TURN_TOKENS, eos_id=TOKENIZER.eos_id,
          pad_id=TOKENIZER.pad_id)
    budgets = [0, 1, 2, TURN_TOKENS, 3, 5, 0, TURN_TOKENS]
    full = decode([TURN_TOKENS] * 8)
    cut = decode(budgets)
    lengths = np.asarray(cut.lengths)
    assert lengths[0] == 0 and lengths[1] == 1
    assert (lengths <= budgets).all()
    np.testing.assert_array_equal(cut.tokens[0], TOKENIZER.pad_id)
    np.testing.assert_array_equal(cut.logits[0], logits[0])
    for row in range(8):
      n = lengths[row]
      np.testing.assert_array_equal(cut.tokens[row, :n], full.tokens[row, :n])
    np.testing.assert_array_equal(
        np.asarray(cut.cache.key_mask)[:, PROMPT_LEN:PROMPT_LEN + TURN_TOKENS],
        np.arange(TURN_TOKENS)[None] < lengths[:, None])

  def test_bad_arguments(self, params):
    cache = models.init_cache(CFG, 2, 8)
    logits = np.zeros((2, CFG.vocab_size), np.float32)
    kwargs = dict(budgets=[1, 1], max_new_tokens=4, eos_id=2, pad_id=0)
    with pytest.raises(ValueError, match="does not fit"):
      sampler.decode_from_cache(CFG, params, cache, logits, [1, 1], 5,
                                jax.random.key(0), **kwargs)
    with pytest.raises(ValueError, match="positions must be"):
      sampler.decode_from_cache(CFG, params, cache, logits, [1, 1, 1], 0,
                                jax.random.key(0), **kwargs)
    with pytest.raises(ValueError, match="logits must be"):
      sampler.decode_from_cache(CFG, params, cache, logits[:, :3], [1, 1], 0,
                                jax.random.key(0), **kwargs)


class TestRepackCache:

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_moves_valid_slots_in_order(self, scan_layers):
    cfg = models.preset("test", 16, scan_layers=scan_layers)
    cache = model_lib.init_cache(cfg, 2, 6)
    rng = np.random.RandomState(0)
    fill = lambda x: jnp.asarray(rng.randn(*x.shape).astype(np.float32))
    cache = cache._replace(k=jax.tree.map(fill, cache.k),
                           v=jax.tree.map(fill, cache.v),
                           key_mask=jnp.array([[0, 1, 0, 1, 1, 0],
                                               [1, 0, 0, 0, 0, 1]], bool))
    out = model_lib.repack_cache(cache, 4, max_len=5)
    # Row 0: slots 1, 3, 4 -> 1, 2, 3; row 1: slots 0, 5 -> 2, 3.
    np.testing.assert_array_equal(out.key_mask, [[0, 1, 1, 1, 0],
                                                 [0, 0, 1, 1, 0]])
    moves = {0: [(1, 1), (3, 2), (4, 3)], 1: [(0, 2), (5, 3)]}
    for layer in range(cfg.num_layers):
      for row, pairs in moves.items():
        for src, dst in pairs:
          np.testing.assert_array_equal(out.k[layer][row, :, dst],
                                        cache.k[layer][row, :, src])
          np.testing.assert_array_equal(out.v[layer][row, :, dst],
                                        cache.v[layer][row, :, src])


class TestErrors:

  @pytest.mark.parametrize("overrides, match", [
      (dict(max_episode_tokens=10_000), "exceeds the model context"),
      (dict(eos_id=NEWLINE), "overlap"),
      (dict(max_turns=0), "max_turns must be an int >= 1"),
      (dict(end_of_turn_ids=[]), "at least one id"),
  ])
  def test_bad_arguments(self, params, overrides, match):
    with pytest.raises(errors.InputError, match=match):
      _run(params, _problems(range(2)), jax.random.key(0), **overrides)


class TestSharding:

  def test_sharded_episodes_match_unsharded(self):
    # The sampler's mesh test, for episodes: a 2x2x2 mesh of fake CPU
    # devices, logical-axis rules active, params sharded.
    cfg = models.preset("test", TOKENIZER.vocab_size)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]).reshape(2, 2, 2), axes.MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * 3)
    shardings = nn.logical_to_mesh_sharding(models.param_logical_axes(cfg),
                                            mesh, axes.DEFAULT_RULES)
    plain = models.init_params(cfg, jax.random.key(0))
    sharded = models.init_params(cfg, jax.random.key(0), shardings=shardings)
    # Shapes of the `sampled` fixture: the reference reuses its programs.
    problems = _problems(range(8))
    short = dict(max_turns=2)
    with nn.logical_axis_rules(axes.DEFAULT_RULES), jax.set_mesh(mesh):
      out = _run(sharded, problems, jax.random.key(1), cfg=cfg, **short)
    reference = _run(plain, problems, jax.random.key(1), cfg=cfg, **short)
    np.testing.assert_array_equal(out.tokens, reference.tokens)
    np.testing.assert_allclose(out.logprobs, reference.logprobs, atol=1e-5)
