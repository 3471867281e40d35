"""Tests of the KV-cache sampler against full forward passes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import models
from rl_rewards.rollout import sampler
from rl_rewards.tasks import segmentation
from rl_rewards.sharding import axes

VOCAB = 13
PAD, BOS = 0, 1
CFG = models.preset("test", VOCAB)
NEW = 8  # max_new_tokens.
# Row 0: 5 real tokens; row 1: 3 real tokens after 2 pads.
PROMPTS = np.array([[BOS, 4, 7, 3, 9], [PAD, PAD, BOS, 5, 11]], np.int32)
PROMPT_MASK = (np.arange(5)[None] >= np.array([[0], [2]])).astype(np.int32)


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0))


def reference_greedy(params, prompts, prompt_mask, new, eos_id, pad_id):
  """Step-by-step argmax of full forward passes over a fixed-size buffer."""
  batch, prompt_len = prompts.shape
  tokens = np.concatenate([prompts, np.full((batch, new), pad_id)], 1)
  mask = np.concatenate([prompt_mask, np.zeros((batch, new), np.int32)], 1)
  logprobs = np.zeros(tokens.shape, np.float32)
  done = np.zeros(batch, bool)
  forward = jax.jit(lambda t, m: models.apply(CFG, params, t,
                                              attention_mask=m)[0])
  for g in range(new):
    logits = np.asarray(forward(tokens, mask))[:, prompt_len + g - 1]
    logp = np.asarray(jax.nn.log_softmax(logits))
    for b in range(batch):
      if done[b]:
        continue
      token = int(np.argmax(logits[b]))
      tokens[b, prompt_len + g] = token
      mask[b, prompt_len + g] = 1
      logprobs[b, prompt_len + g] = logp[b, token]
      done[b] = token == eos_id
  return tokens, mask, logprobs


@pytest.fixture(scope="module")
def eos_id(params):
  """A token that greedy decoding emits early in row 0 but never in row 1,
  so that the greedy tests see one finished and one truncated row."""
  tokens, _, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                  eos_id=-1, pad_id=PAD)
  response = tokens[:, 5:]
  for token in response[0, 1:NEW - 1]:
    if token not in response[1] and token not in response[0, :1]:
      return int(token)
  pytest.fail(f"test setup: no usable EOS in greedy outputs {response}")


@pytest.fixture(scope="module")
def greedy(params, eos_id):
  return sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                        max_new_tokens=NEW, temperature=0.0, eos_id=eos_id,
                        pad_id=PAD)


@pytest.fixture(scope="module")
def sampled(params, eos_id):
  """Three temperature-1 samples per prompt."""
  return sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(7),
                        max_new_tokens=NEW, temperature=1.0, eos_id=eos_id,
                        pad_id=PAD, num_samples=3)


class TestGreedy:

  def test_matches_stepwise_argmax(self, params, greedy, eos_id):
    tokens, mask, logprobs = reference_greedy(params, PROMPTS, PROMPT_MASK,
                                              NEW, eos_id, PAD)
    np.testing.assert_array_equal(greedy.tokens, tokens)
    np.testing.assert_array_equal(greedy.attention_mask, mask)
    np.testing.assert_allclose(greedy.logprobs, logprobs, atol=1e-4)

  def test_eos_handling(self, greedy, eos_id):
    response = np.asarray(greedy.tokens[:, 5:])
    response_mask = np.asarray(greedy.response_mask[:, 5:])
    assert not greedy.response_mask[:, :5].any()
    assert not greedy.logprobs[:, :5].any()
    finished = []
    for b in range(2):
      hits = np.nonzero(response[b] == eos_id)[0]
      if hits.size:
        end = hits[0]
        finished.append(True)
        assert (response[b, end + 1:] == PAD).all()
        np.testing.assert_array_equal(response_mask[b],
                                      np.arange(NEW) <= end)
        assert not greedy.logprobs[b, 5 + end + 1:].any()
        assert (greedy.logprobs[b, 5:5 + end + 1] < 0).all()
        assert greedy.lengths[b] == end + 1 and not greedy.truncated[b]
      else:
        finished.append(False)
        assert response_mask[b].all() and greedy.lengths[b] == NEW
        assert greedy.truncated[b]
    assert finished == [True, False]  # The eos_id fixture guarantees it.

  def test_left_padding_invariance(self, params, greedy, eos_id):
    more = np.concatenate([np.full((2, 3), PAD), PROMPTS], 1)
    more_mask = np.concatenate([np.zeros((2, 3), np.int32), PROMPT_MASK], 1)
    out = sampler.sample(CFG, params, more, more_mask, jax.random.key(0),
                         max_new_tokens=NEW, temperature=0.0, eos_id=eos_id,
                         pad_id=PAD)
    np.testing.assert_array_equal(out.tokens[:, 3:], greedy.tokens)
    np.testing.assert_array_equal(out.response_mask[:, 3:],
                                  greedy.response_mask)
    np.testing.assert_allclose(out.logprobs[:, 3:], greedy.logprobs,
                               atol=1e-5)

  def test_top_p_near_zero_is_greedy(self, params, greedy, eos_id):
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(3),
                         max_new_tokens=NEW, temperature=1.0, top_p=1e-6,
                         eos_id=eos_id, pad_id=PAD)
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-6)

  def test_without_eos_runs_to_max_new_tokens(self, params):
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                         max_new_tokens=NEW, temperature=0.0, eos_id=None,
                         pad_id=PAD)
    tokens, _, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                    eos_id=-1, pad_id=PAD)
    np.testing.assert_array_equal(out.tokens, tokens)
    assert out.truncated.all() and (out.lengths == NEW).all()

  def test_pad_equal_to_eos(self, params, eos_id):
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                         max_new_tokens=NEW, temperature=0.0, eos_id=eos_id,
                         pad_id=eos_id)
    tokens, mask, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                       eos_id, eos_id)
    np.testing.assert_array_equal(out.tokens[:, 5:], tokens[:, 5:])
    np.testing.assert_array_equal(out.response_mask[:, 5:], mask[:, 5:])


class TestSampled:

  def test_logprobs_match_full_forward(self, params, sampled):
    full = models.token_logprobs(CFG, params, sampled.tokens,
                                 sampled.attention_mask)
    response = sampled.response_mask.astype(bool)
    np.testing.assert_allclose(np.asarray(sampled.logprobs)[response],
                               np.asarray(full)[response], atol=1e-4)
    assert not np.asarray(sampled.logprobs)[~response].any()

  def test_num_samples_equals_repeated_prompts(self, params, sampled,
                                               eos_id):
    repeated = sampler.sample(
        CFG, params, np.repeat(PROMPTS, 3, 0), np.repeat(PROMPT_MASK, 3, 0),
        jax.random.key(7), max_new_tokens=NEW, temperature=1.0,
        eos_id=eos_id, pad_id=PAD)
    for a, b in zip(sampled, repeated):
      np.testing.assert_allclose(a, b, atol=1e-5)
    # Prompt-major rows: the prompt of row r is prompt r // 3 ...
    np.testing.assert_array_equal(sampled.tokens[:, :5],
                                  np.repeat(PROMPTS, 3, 0))
    # ... and the samples of a prompt differ from each other.
    responses = {tuple(row) for row in np.asarray(sampled.tokens[:, 5:])}
    assert len(responses) > 2

  def test_no_recompile(self, params, sampled, eos_id):
    del sampled  # Compiled the sampled variant for these shapes.
    before = sampler._jit_sample._cache_size()
    again = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                           jax.random.key(99), max_new_tokens=NEW,
                           temperature=0.7, eos_id=eos_id, pad_id=PAD,
                           num_samples=3,
                           delimiter_mask=np.arange(VOCAB) == 4)
    jax.block_until_ready(again)
    assert sampler._jit_sample._cache_size() == before

  @pytest.mark.parametrize("temperature,top_p", [(2.0, 1.0), (1.0, 0.6)])
  def test_first_token_distribution(self, params, temperature, top_p):
    n = 4000
    out = sampler.sample(CFG, params, PROMPTS[:1], PROMPT_MASK[:1],
                         jax.random.key(1), max_new_tokens=1,
                         temperature=temperature, top_p=top_p, eos_id=PAD,
                         pad_id=PAD, num_samples=n)
    logits = np.asarray(models.logits(CFG, params, PROMPTS[:1]),
                        np.float64)[0, -1] / temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    # Nucleus by hand: most likely tokens until the mass before reaches p.
    order = np.argsort(-probs)
    keep = np.zeros(VOCAB, bool)
    mass = 0.0
    for token in order:
      if mass >= top_p:
        break
      keep[token] = True
      mass += probs[token]
    expected = np.where(keep, probs, 0) / probs[keep].sum()
    counts = np.bincount(np.asarray(out.tokens[:, -1]), minlength=VOCAB)
    np.testing.assert_allclose(counts / n, expected, atol=0.03)
    assert counts[~keep].sum() == 0


class TestStepIds:

  def test_delimiter_before_final_eos_joins_the_last_step(self, params):
    # The sampler uses the segmentation module's rule: "a\n<EOS>" is one
    # step, like the text "a\n" (tasks/segmentation.py).
    delimiters = np.arange(VOCAB) == 9
    tokens = np.array([[5, 5, 4, 9, 9, 7, 2, 0], [5, 5, 4, 4, 9, 2, 0, 0]])
    response = np.array([[0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 0, 0]])
    ids = segmentation.step_ids_from_tokens(tokens, response, delimiters,
                                            eos_id=2)
    np.testing.assert_array_equal(ids, [[-1, -1, 0, 0, 1, 2, 2, -1],
                                        [-1, -1, 0, 0, 0, 0, -1, -1]])

  def test_sampler_step_ids(self, params, eos_id):
    delimiters = np.isin(np.arange(VOCAB), [3, 8, 10])
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(7),
                         max_new_tokens=NEW, temperature=1.0, eos_id=eos_id,
                         pad_id=PAD, num_samples=3, delimiter_mask=delimiters)
    tokens, response = np.asarray(out.tokens), np.asarray(out.response_mask)
    num_delimiters = 0
    for b in range(tokens.shape[0]):
      step = 0
      for t in range(tokens.shape[1]):
        if not response[b, t]:
          assert out.step_ids[b, t] == -1
          continue
        assert out.step_ids[b, t] == step
        final_eos = (t + 1 < tokens.shape[1] and response[b, t + 1] and
                     tokens[b, t + 1] == eos_id and
                     (t + 2 >= tokens.shape[1] or not response[b, t + 2]))
        if delimiters[tokens[b, t]] and not final_eos:
          step += 1
          num_delimiters += 1
    assert num_delimiters > 0  # The case was exercised.


class TestTopP:

  def test_hand_computed(self):
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    # Mass before each token: 0, .5, .8, .95.
    keep = lambda p: np.isfinite(sampler.top_p_logits(logits, p))[0].tolist()
    assert keep(0.7) == [True, True, False, False]
    assert keep(0.5) == [True, False, False, False]
    assert keep(0.81) == [True, True, True, False]
    assert keep(1.0) == [True, True, True, True]
    assert keep(1e-9) == [True, False, False, False]

  def test_ties_keep_the_smallest_set_lowest_ids_first(self):
    keep = lambda logits, p: np.isfinite(
        sampler.top_p_logits(jnp.asarray(logits, jnp.float32), p)).tolist()
    # Four equal tokens: two of them reach 0.3; four would be too many.
    assert keep([0.0, 0.0, 0.0, 0.0], 0.3) == [True, True, False, False]
    # .4 + .3 reaches .5, the third token is not needed.
    assert keep(np.log([0.4, 0.3, 0.3]), 0.5) == [True, True, False]
    assert keep(np.log([0.3, 0.3, 0.4]), 0.5) == [True, False, True]
    # Probabilities .711, .096, .096, .096 (id 1 first): the mass before
    # ids 1, 0, 2, 3 is 0, .711, .807, .904. The most likely token is kept
    # even when it alone exceeds p; among the tied runners-up the lower id
    # goes first.
    assert keep([1.0, 3.0, 1.0, 1.0], 0.9) == [True, True, True, False]
    assert keep([1.0, 3.0, 1.0, 1.0], 0.75) == [True, True, False, False]
    assert keep([1.0, 3.0, 1.0, 1.0], 1e-6) == [False, True, False, False]

  @pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.99])
  def test_matches_a_plain_loop_on_tied_bfloat16_logits(self, top_p):
    rng = np.random.default_rng(int(top_p * 100))
    # bfloat16 rounding of a few distinct levels: many exact ties.
    logits = np.asarray(jnp.asarray(
        rng.integers(0, 6, size=(64, 40)) * 0.7 + rng.normal(
            size=(64, 40)) * 0.01, jnp.bfloat16).astype(jnp.float32))
    got = np.isfinite(np.asarray(jax.jit(sampler.top_p_logits)(
        jnp.asarray(logits), jnp.float32(top_p))))
    checked = 0
    for row, kept in zip(logits, got):
      probs = np.exp(row.astype(np.float64) - row.max())
      probs /= probs.sum()
      order = sorted(range(len(row)), key=lambda i: (-row[i], i))
      expected = np.zeros(len(row), bool)
      mass, margin = 0.0, np.inf
      for i in order:
        margin = min(margin, abs(mass - top_p))
        if mass >= top_p:
          break
        expected[i] = True
        mass += probs[i]
      if margin < 1e-5:
        continue  # Float32 and float64 sums may round differently here.
      checked += 1
      np.testing.assert_array_equal(kept, expected)
    assert checked > 50

  @pytest.mark.parametrize("top_p", [0.1, 0.3, 0.7, 0.95])
  def test_matches_transformers_up_to_tie_order(self, top_p):
    """transformers' TopPLogitsWarper removes, in ascending order, the tokens
    whose cumulative probability is <= 1 - p: the same number of tokens per
    row. Among tied logits it may keep other ids (its sort order is not
    specified; on 4 equal logits it keeps ids 2 and 3, this rule 0 and 1),
    so the kept logit values are compared as multisets."""
    torch = pytest.importorskip("torch")
    logits_process = pytest.importorskip(
        "transformers.generation.logits_process")
    rng = np.random.default_rng(3)
    logits = np.asarray(jnp.asarray(
        rng.integers(0, 5, size=(32, 24)) * 0.9, jnp.bfloat16).astype(
            jnp.float32))
    ours = np.isfinite(np.asarray(sampler.top_p_logits(logits, top_p)))
    warper = logits_process.TopPLogitsWarper(top_p)
    theirs = np.isfinite(warper(None, torch.tensor(logits)).numpy())
    for row, a, b in zip(logits, ours, theirs):
      assert sorted(row[a]) == sorted(row[b])
    # On distinct logits the kept sets are the same tokens.
    distinct = rng.normal(size=(16, 24)).astype(np.float32)
    np.testing.assert_array_equal(
        np.isfinite(np.asarray(sampler.top_p_logits(distinct, top_p))),
        np.isfinite(warper(None, torch.tensor(distinct)).numpy()))

  def test_leading_batch_dimensions(self):
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 7)),
                         jnp.float32)
    flat = sampler.top_p_logits(logits.reshape(6, 7), 0.6)
    np.testing.assert_array_equal(sampler.top_p_logits(logits, 0.6),
                                  np.asarray(flat).reshape(2, 3, 7))


class TestStopIds:

  def test_any_stop_id_ends_a_row(self, params):
    free, _, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                  eos_id=-1, pad_id=PAD)
    response = free[:, 5:]
    # A token of row 0 (not its first) and another token of row 1 that row 0
    # never emits before its own stop.
    first = int(response[0, 2])
    end0 = int(np.argmax(response[0] == first))
    seconds = [int(t) for t in response[1]
               if t != first and t not in response[0, :end0 + 1]]
    if not seconds:
      pytest.skip("greedy outputs leave no second stop token")
    second = seconds[0]
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                         jax.random.key(0), max_new_tokens=NEW,
                         temperature=0.0, eos_id=(first, second), pad_id=PAD)
    for b in range(2):
      row = response[b]
      end = int(np.argmax(np.isin(row, [first, second])))
      assert np.isin(row, [first, second]).any()
      assert int(out.lengths[b]) == end + 1
      np.testing.assert_array_equal(out.tokens[b, 5:5 + end + 1],
                                    row[:end + 1])
      assert (np.asarray(out.tokens[b, 5 + end + 1:]) == PAD).all()
      np.testing.assert_array_equal(
          out.response_mask[b], np.r_[np.zeros(5), np.ones(end + 1),
                                      np.zeros(NEW - end - 1)])
    assert not np.asarray(out.truncated).any()
    assert not np.asarray(out.stopped).any()

  def test_single_id_and_one_element_sequence_agree(self, params, greedy,
                                                    eos_id):
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                         jax.random.key(0), max_new_tokens=NEW,
                         temperature=0.0, eos_id=[eos_id], pad_id=PAD)
    for a, b in zip(out, greedy):
      np.testing.assert_array_equal(a, b)

  def test_bad_stop_ids(self, params):
    for bad in ((2, VOCAB), ("a",), 2.0):
      with pytest.raises(ValueError, match="eos_id"):
        sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                       max_new_tokens=NEW, temperature=0.0, eos_id=bad,
                       pad_id=PAD)


class TestPaddedVocab:
  """A model with more embedding rows than the tokenizer has tokens."""

  TOKENS = VOCAB - 3  # Ids 10, 11, 12 are padding rows.

  def test_choose_tokens_never_picks_padding(self):
    logits = jnp.array([[0.0, 1.0, 2.0, 9.0, 8.0]] * 3, jnp.float32)
    noise = jax.random.gumbel(jax.random.key(0), (3, 5))
    for greedy in (True, False):
      tokens, logp = sampler._choose_tokens(
          logits, noise, 1.0, 0.5, greedy=greedy, use_top_p=not greedy,
          num_tokens=3)
      assert (np.asarray(tokens) == 2).all()
      # Log-probs of the full softmax (the trainer's convention).
      np.testing.assert_allclose(
          logp, jax.nn.log_softmax(logits[0])[2], rtol=1e-6)
    tokens, _ = sampler._choose_tokens(logits, noise, 1.0, 1.0, greedy=True,
                                       use_top_p=False)
    assert (np.asarray(tokens) == 3).all()  # Without the mask: padding.

  def test_padding_ids_are_never_sampled(self, params):
    # Padding logits made large where greedy decoding would pick them.
    free, _, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                  eos_id=-1, pad_id=PAD)
    favoured = dict(params)
    head = np.asarray(params["lm_head"]).copy()
    head[:, self.TOKENS:] = 3.0 * head[:, [int(free[0, 5])]]
    favoured["lm_head"] = jnp.asarray(head)
    kwargs = dict(max_new_tokens=NEW, eos_id=None, pad_id=PAD)
    plain = sampler.sample(CFG, favoured, PROMPTS, PROMPT_MASK,
                           jax.random.key(0), temperature=0.0, **kwargs)
    assert (np.asarray(plain.tokens[:, 5:]) >= self.TOKENS).any()
    for temperature, top_p in ((0.0, 1.0), (3.0, 1.0), (3.0, 0.9)):
      out = sampler.sample(CFG, favoured, PROMPTS, PROMPT_MASK,
                           jax.random.key(1), temperature=temperature,
                           top_p=top_p, num_samples=16,
                           num_tokens=self.TOKENS, **kwargs)
      assert (np.asarray(out.tokens[:, 5:]) < self.TOKENS).all()
    # Greedy equals the argmax over the tokenizer's ids.
    logits = np.asarray(models.apply(CFG, favoured, PROMPTS,
                                     attention_mask=PROMPT_MASK)[0])[:, -1]
    greedy = sampler.sample(CFG, favoured, PROMPTS, PROMPT_MASK,
                            jax.random.key(0), temperature=0.0,
                            num_tokens=self.TOKENS, **kwargs)
    np.testing.assert_array_equal(greedy.tokens[:, 5],
                                  logits[:, :self.TOKENS].argmax(-1))

  def test_bad_num_tokens(self, params):
    for bad in (0, VOCAB + 1, 2.5):
      with pytest.raises(ValueError, match="num_tokens"):
        sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                       max_new_tokens=NEW, temperature=0.0, eos_id=2,
                       pad_id=PAD, num_tokens=bad)


class TestErrors:

  def _sample(self, params, **overrides):
    kwargs = dict(prompt_tokens=PROMPTS, prompt_mask=PROMPT_MASK,
                  rng=jax.random.key(0), max_new_tokens=NEW,
                  temperature=0.0, eos_id=2, pad_id=PAD)
    kwargs.update(overrides)
    return sampler.sample(CFG, params, **kwargs)

  @pytest.mark.parametrize("overrides,match", [
      (dict(prompt_mask=PROMPT_MASK[:, ::-1]), "left-padded"),
      (dict(prompt_mask=PROMPT_MASK[:1]), "prompt_mask shape"),
      (dict(prompt_tokens=PROMPTS[0]), r"\[B, P\]"),
      (dict(top_p=0.0), "top_p"),
      (dict(temperature=-1.0), "temperature"),
      (dict(eos_id=VOCAB), "eos_id"),
      (dict(max_new_tokens=0), "max_new_tokens"),
      (dict(max_new_tokens=300), "max_position_embeddings"),
      (dict(num_samples=0), "num_samples"),
      (dict(delimiter_mask=np.zeros(4, bool)), "delimiter_mask"),
  ])
  def test_bad_arguments(self, params, overrides, match):
    with pytest.raises(ValueError, match=match):
      self._sample(params, **overrides)

  def test_all_padding_row_is_finite(self, params, greedy, eos_id):
    del greedy  # Same shapes and ids: reuses the compiled greedy sampler.
    prompts = PROMPTS.copy()
    prompts[1] = PAD
    mask = PROMPT_MASK.copy()
    mask[1] = 0
    out = self._sample(params, prompt_tokens=prompts, prompt_mask=mask,
                       eos_id=eos_id)
    assert np.isfinite(np.asarray(out.logprobs)).all()
    assert out.lengths[1] >= 1


class TestSharding:

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_sharded_params_and_batch_match_unsharded(self, scan_layers):
    # Vocabulary divisible by the mesh.
    cfg = models.preset("test", 16, scan_layers=scan_layers)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]).reshape(2, 2, 2), axes.MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * 3)
    shardings = nn.logical_to_mesh_sharding(models.param_logical_axes(cfg),
                                            mesh, axes.DEFAULT_RULES)
    # The reference: per-layer blocks, unsharded.
    plain_cfg = cfg.replace(scan_layers=False)
    plain = models.init_params(plain_cfg, jax.random.key(0))
    sharded = models.init_params(cfg, jax.random.key(0), shardings=shardings)
    prompts = np.random.RandomState(0).randint(1, 16, (4, 6)).astype(np.int32)
    mask = np.ones((4, 6), np.int32)
    batch = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec((axes.DATA, axes.FSDP)))
    kwargs = dict(max_new_tokens=6, temperature=1.0, eos_id=2, pad_id=0,
                  num_samples=2)
    with nn.logical_axis_rules(axes.DEFAULT_RULES), jax.set_mesh(mesh):
      out = sampler.sample(cfg, sharded, jax.device_put(prompts, batch),
                           jax.device_put(mask, batch), jax.random.key(1),
                           **kwargs)
    reference = sampler.sample(plain_cfg, plain, prompts, mask,
                               jax.random.key(1), **kwargs)
    np.testing.assert_array_equal(out.tokens, reference.tokens)
    np.testing.assert_allclose(out.logprobs, reference.logprobs, atol=1e-5)


class TestScanLayers:
  """Scanned blocks (stacked parameters and cache) sample the same tokens."""

  @pytest.mark.usefixtures("segmented_from_8")
  @pytest.mark.parametrize("temperature,num_samples", [(0.0, 1), (1.0, 3)])
  def test_same_tokens_as_per_layer_blocks(self, params, eos_id, temperature,
                                           num_samples):
    scan_cfg = CFG.replace(scan_layers=True)
    kwargs = dict(max_new_tokens=16, temperature=temperature, eos_id=eos_id,
                  pad_id=PAD, num_samples=num_samples)
    reference = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                               jax.random.key(3), **kwargs)
    scanned = sampler.sample(scan_cfg, models.stack_layers(CFG, params),
                             PROMPTS, PROMPT_MASK, jax.random.key(3),
                             **kwargs)
    np.testing.assert_array_equal(scanned.tokens, reference.tokens)
    np.testing.assert_array_equal(scanned.lengths, reference.lengths)
    np.testing.assert_allclose(scanned.logprobs, reference.logprobs,
                               atol=1e-5)
    assert np.asarray(reference.response_mask).sum() > 2 * len(PROMPTS)


@pytest.fixture
def segmented_from_8(monkeypatch):
  """Decoding in segments (a growing cache) from G = 8 on."""
  monkeypatch.setattr(sampler, "SEGMENTED_DECODE_MIN_TOKENS", 8)


@pytest.fixture(scope="module")
def free_run(params):
  """Greedy continuations without EOS (no row ends early)."""
  tokens, _, _ = reference_greedy(params, PROMPTS, PROMPT_MASK, NEW,
                                  eos_id=-1, pad_id=PAD)
  return tokens[:, 5:]


class TestStopMask:

  def _sample(self, params, stop_tokens, eos_id=None):
    stop = np.isin(np.arange(VOCAB), stop_tokens)
    return sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                          jax.random.key(0), max_new_tokens=NEW,
                          temperature=0.0, eos_id=eos_id, pad_id=PAD,
                          stop_mask=stop)

  def test_rows_stop_after_the_first_stop_token(self, params, free_run):
    # Stop on the token greedy decoding emits second in row 0.
    stop_token = int(free_run[0, 1])
    out = self._sample(params, [stop_token])
    for b in range(2):
      hits = np.nonzero(free_run[b] == stop_token)[0]
      response = np.asarray(out.tokens[b, 5:])
      if hits.size:
        end = int(hits[0])
        np.testing.assert_array_equal(response[:end + 1],
                                      free_run[b, :end + 1])
        assert (response[end + 1:] == PAD).all()
        np.testing.assert_array_equal(out.response_mask[b, 5:],
                                      np.arange(NEW) <= end)
        assert out.lengths[b] == end + 1
        assert out.stopped[b] and not out.truncated[b]
      else:
        np.testing.assert_array_equal(response, free_run[b])
        assert out.truncated[b] and not out.stopped[b]
    assert out.stopped[0]  # Guaranteed by the choice of the stop token.

  def test_eos_before_a_stop_token_is_not_stopped(self, params, free_run):
    eos = int(free_run[0, 0])
    later = [int(t) for t in free_run[0, 1:] if t != eos]
    stop_token = later[0] if later else (eos + 1) % VOCAB
    out = self._sample(params, [stop_token], eos_id=eos)
    assert out.lengths[0] == 1
    assert not out.stopped[0] and not out.truncated[0]

  def test_stop_token_ends_its_step(self, params, free_run):
    # The stop token is also the delimiter: the response is exactly one
    # step ending at the stop token (what step-level search relies on).
    stop_token = int(free_run[0, 1])
    stop = np.arange(VOCAB) == stop_token
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                         jax.random.key(0), max_new_tokens=NEW,
                         temperature=0.0, eos_id=None, pad_id=PAD,
                         delimiter_mask=stop, stop_mask=stop)
    ids = np.asarray(out.step_ids[0])
    assert set(ids[ids >= 0].tolist()) == {0}

  def test_default_has_no_stopped_rows_and_no_recompile(self, params):
    kwargs = dict(max_new_tokens=NEW, temperature=0.0, eos_id=None,
                  pad_id=PAD)
    plain = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                           jax.random.key(0), **kwargs)
    assert not np.asarray(plain.stopped).any()
    first = self._sample(params, [3])
    jax.block_until_ready(first)
    before = sampler._jit_sample._cache_size()
    # Another mask of the same shape, and the default again: no new trace.
    jax.block_until_ready(self._sample(params, [4, 5]))
    jax.block_until_ready(sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                                         jax.random.key(1), **kwargs))
    assert sampler._jit_sample._cache_size() == before

  def test_bad_stop_mask_shape(self, params):
    with pytest.raises(ValueError, match="stop_mask"):
      sampler.sample(CFG, params, PROMPTS, PROMPT_MASK, jax.random.key(0),
                     max_new_tokens=NEW, temperature=0.0, eos_id=None,
                     pad_id=PAD, stop_mask=np.zeros(3, bool))


class TestSegmentedDecoding:
  """Decoding in segments with a growing cache (G >= the threshold)."""

  def test_segment_ends(self):
    threshold = sampler.SEGMENTED_DECODE_MIN_TOKENS
    assert sampler.decode_segment_ends(threshold - 1) == (threshold - 1,)
    assert sampler.decode_segment_ends(256) == (32, 64, 128, 256)
    assert sampler.decode_segment_ends(130) == (16, 32, 65, 130)

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_grow_cache_keeps_slots_and_adds_empty_ones(self, params,
                                                      scan_layers):
    cfg = CFG.replace(scan_layers=scan_layers)
    if scan_layers:
      params = models.stack_layers(CFG, params)
    cache = models.init_cache(cfg, 2, 5)
    _, cache = models.apply(cfg, params, PROMPTS, attention_mask=PROMPT_MASK,
                            cache=cache, cache_index=0)
    grown = models.grow_cache(cache, 9)
    assert grown.max_len == 9 and grown.stacked == scan_layers
    np.testing.assert_array_equal(grown.key_mask[:, :5], cache.key_mask)
    assert not np.any(grown.key_mask[:, 5:])
    # Layer i's keys/values are [B, KVH, S, Dh] in both layouts.
    for i in range(cfg.num_layers):
      for old, new in ((cache.k[i], grown.k[i]), (cache.v[i], grown.v[i])):
        assert new.shape == (2, cfg.num_kv_heads, 9, cfg.head_dim)
        np.testing.assert_array_equal(new[:, :, :5], old)
        assert np.any(old) and not np.any(new[:, :, 5:])
    with pytest.raises(ValueError, match="cannot shrink"):
      models.grow_cache(cache, 4)

  @pytest.mark.parametrize("scan_layers", [False, True])
  def test_repeat_cache(self, params, scan_layers):
    cfg = CFG.replace(scan_layers=scan_layers)
    if scan_layers:
      params = models.stack_layers(CFG, params)
    _, cache = models.apply(cfg, params, PROMPTS, attention_mask=PROMPT_MASK,
                            cache=models.init_cache(cfg, 2, 5), cache_index=0)
    tiled = models.repeat_cache(cache, 3)
    assert tiled.stacked == scan_layers and tiled.key_mask.shape == (6, 5)
    for row in range(6):
      np.testing.assert_array_equal(tiled.key_mask[row],
                                    cache.key_mask[row // 3])
      for i in range(cfg.num_layers):
        np.testing.assert_array_equal(tiled.k[i][row], cache.k[i][row // 3])
        np.testing.assert_array_equal(tiled.v[i][row], cache.v[i][row // 3])

  @pytest.fixture
  def segmented(self, monkeypatch):
    """Runs `sample` with segments from G = 8 on: ends (2, 4, 8, 16) for 16."""
    monkeypatch.setattr(sampler, "SEGMENTED_DECODE_MIN_TOKENS", 8)
    assert sampler.decode_segment_ends(16) == (2, 4, 8, 16)

  @pytest.mark.usefixtures("segmented")
  def test_greedy_matches_stepwise_argmax(self, params, eos_id):
    out = sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                         jax.random.key(0), max_new_tokens=16,
                         temperature=0.0, eos_id=eos_id, pad_id=PAD)
    tokens, mask, logprobs = reference_greedy(params, PROMPTS, PROMPT_MASK,
                                              16, eos_id, PAD)
    np.testing.assert_array_equal(out.tokens, tokens)
    np.testing.assert_array_equal(out.attention_mask, mask)
    np.testing.assert_allclose(out.logprobs, logprobs, atol=1e-5)
    # One row ended on EOS inside a segment, the other ran to the end.
    assert sorted(np.asarray(out.truncated).tolist()) == [False, True]

  def test_sampled_equals_one_segment(self, params, eos_id, monkeypatch):
    def run():
      return sampler.sample(CFG, params, PROMPTS, PROMPT_MASK,
                            jax.random.key(3), max_new_tokens=16,
                            temperature=1.0, eos_id=eos_id, pad_id=PAD,
                            num_samples=4)
    whole = run()
    monkeypatch.setattr(sampler, "SEGMENTED_DECODE_MIN_TOKENS", 8)
    in_segments = run()
    np.testing.assert_array_equal(in_segments.tokens, whole.tokens)
    np.testing.assert_array_equal(in_segments.lengths, whole.lengths)
    np.testing.assert_allclose(in_segments.logprobs, whole.logprobs,
                               atol=1e-5)
    # The rows end at different steps, some inside the first segments.
    assert len(set(np.asarray(whole.lengths).tolist())) > 1
