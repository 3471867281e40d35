"""Parity with transformers for every supported family, on one decoder.

For each family a tiny random transformers model (float32) is saved with
`save_pretrained` in the hub's layout and loaded with `load_hf`; our logits
must match within 1e-4 on left-padded rows longer than the sliding window and
past the RoPE scaling's original context, greedy decoding must match
`generate(do_sample=False)` token for token, `save_hf` must give a
checkpoint both we and transformers reload to the same logits, a bf16
checkpoint must load, and one SFT, policy and value step must run with
finite losses. Every config carries a vocabulary padded beyond the tokens
used (48 ids, tokens < 40), as the hub's Qwen2.5 (151936 vs 151665).

Variants named `*_legacy` rewrite config.json into the older hub spelling
(top-level `rope_theta` + `rope_scaling` with `rope_type` or `type`; Gemma 3's
`rope_local_base_freq` and `sliding_window_pattern`) and only check logits.

Skipped without torch / transformers >= 5: `pip install -e '.[hf]'`.
"""

import copy
import json
import os

import jax
import numpy as np
import optax
import pytest

from rl_rewards import models
from rl_rewards.rollout import sampler
from rl_rewards.train import state as state_lib
from rl_rewards.train import steps

torch = pytest.importorskip(
    "torch", reason="PyTorch is needed for the Hugging Face parity tests.")
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is needed for the Hugging Face parity tests.")
if int(transformers.__version__.split(".")[0]) < 5:
  pytest.skip("the tiny checkpoints are built with transformers 5's "
              "rope_parameters and layer_types", allow_module_level=True)

VOCAB = 48       # config.json vocab_size
TOKENS = 40      # ids a tokenizer would produce; [40, 48) is padding
PAD = 0
ORIGINAL = 32    # original_max_position_embeddings of llama3 / yarn
NEW = 10

_SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=48,
              max_position_embeddings=128, rms_norm_eps=1e-6)


def _qwen2():
  return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      **_SMALL, num_hidden_layers=2, rope_theta=1e4,
      tie_word_embeddings=False))


def _qwen3():
  # head_dim 16 != hidden / heads = 8; tied embeddings.
  return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
      **_SMALL, num_hidden_layers=2, head_dim=16, rope_theta=1e6,
      tie_word_embeddings=True, attention_bias=False))


def _llama(rope_parameters):
  return transformers.LlamaForCausalLM(transformers.LlamaConfig(
      **{**_SMALL, "num_key_value_heads": 1}, num_hidden_layers=2,
      head_dim=16, rope_parameters=rope_parameters,
      tie_word_embeddings=False))


def _llama3():
  # head_dim 16, theta 1e4: wavelengths 6.3 (< 32/4: kept), 19.9 (between:
  # smoothed) and >= 62.8 (> 32/1: divided by the factor).
  return _llama({"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": ORIGINAL})


def _llama_linear():
  return _llama({"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})


def _yarn():
  return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      **_SMALL, num_hidden_layers=2, tie_word_embeddings=True,
      rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                       "factor": 4.0,
                       "original_max_position_embeddings": ORIGINAL}))


def _mistral():
  return transformers.MistralForCausalLM(transformers.MistralConfig(
      **_SMALL, num_hidden_layers=2, head_dim=16, rope_theta=1e4,
      sliding_window=6, tie_word_embeddings=False))


def _gemma3():
  # Sliding, full, sliding; a linear RoPE scaling on the full layer only
  # (as Gemma 3 4B+), the local base on the sliding ones.
  return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
      **_SMALL, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=12,
      layer_types=["sliding_attention", "full_attention",
                   "sliding_attention"],
      sliding_window=5, tie_word_embeddings=True, pad_token_id=PAD,
      rope_parameters={
          "full_attention": {"rope_type": "linear", "factor": 2.0,
                             "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default",
                                "rope_theta": 1e4}}))


def _to_legacy(config, scaling_key="rope_type"):
  """config.json with `rope_parameters` -> rope_theta + rope_scaling."""
  rope = dict(config.pop("rope_parameters"))
  config["rope_theta"] = rope.pop("rope_theta")
  rope_type = rope.pop("rope_type")
  config["rope_scaling"] = (None if rope_type == "default"
                            else {scaling_key: rope_type, **rope})
  return config


def _gemma3_legacy(config):
  rope = config.pop("rope_parameters")
  config.pop("layer_types")
  config["sliding_window_pattern"] = 2  # sliding, full, sliding
  config["rope_theta"] = rope["full_attention"]["rope_theta"]
  config["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
  config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
  return config


# name -> (model builder, config.json rewrite or None, runs every check).
VARIANTS = {
    "qwen2": (_qwen2, None, True),
    "qwen3": (_qwen3, None, True),
    "llama3": (_llama3, None, True),
    "llama3_legacy": (_llama3, _to_legacy, False),
    "llama_linear_legacy": (
        _llama_linear, lambda c: _to_legacy(c, scaling_key="type"), True),
    "yarn": (_yarn, None, True),
    "yarn_legacy": (_yarn, lambda c: _to_legacy(c, scaling_key="type"),
                    False),
    "mistral": (_mistral, None, True),
    "gemma3": (_gemma3, None, True),
    "gemma3_legacy": (_gemma3, _gemma3_legacy, False),
}
FULL = [name for name, (_, _, full) in VARIANTS.items() if full]
# Sliding windows (mixed with full layers in gemma3): also run scanned, and
# decode greedily, in the default (fast) selection; the rest is `slow`.
_WINDOWED = ("mistral", "gemma3", "gemma3_legacy")


def _cases(names, fast):
  return [name if name in fast else pytest.param(name, marks=pytest.mark.slow)
          for name in names]
_BUILT = {}


@pytest.fixture(scope="module", autouse=True)
def fast_compiles():
  # Optimisation passes dominate the compile time of these tiny programs.
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


def _randomize(model):
  """Weights large enough for peaked logits (greedy ties are unlikely)."""
  gemma = model.config.model_type == "gemma3_text"
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        # Gemma stores w of x * (1 + w).
        p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.1 if gemma else 0.25)
  model.eval()
  return model


def _built(name, tmp_path_factory):
  """(HF model, checkpoint directory) of a variant, built once a module."""
  if name not in _BUILT:
    build, rewrite, _ = VARIANTS[name]
    torch.manual_seed(sorted(VARIANTS).index(name))
    model = _randomize(build())
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(str(path), safe_serialization=True)
    if rewrite is not None:
      config_path = os.path.join(path, "config.json")
      with open(config_path) as f:
        config = json.load(f)
      with open(config_path, "w") as f:
        json.dump(rewrite(config), f)
    _BUILT[name] = model, str(path)
  return _BUILT[name]


def _rows(lengths, total, seed):
  """Left-padded rows of random ids < TOKENS, and their masks."""
  rng = np.random.default_rng(seed)
  tokens = np.full((len(lengths), total), PAD, np.int64)
  for row, n in enumerate(lengths):
    tokens[row, total - n:] = rng.integers(1, TOKENS, n)
  return tokens, (tokens != PAD).astype(np.int64)


# Longer than every sliding window and past the original context (32).
TOKENS_40, MASK_40 = _rows([40, 35, 29], 40, seed=1)
PROMPTS, PROMPT_MASK = _rows([28, 24, 19], 28, seed=2)


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens),
                 attention_mask=torch.tensor(mask)).logits.float().numpy()


def _max_diff(ours, expected, mask):
  valid = mask.astype(bool)
  return float(np.abs(np.asarray(ours)[valid] - expected[valid]).max())


@pytest.mark.parametrize("name,scan_layers",
                         [(name, False) for name in VARIANTS] +
                         [pytest.param(name, True, marks=(
                             () if name in _WINDOWED else pytest.mark.slow))
                          for name in VARIANTS])
def test_logits_match(name, scan_layers, tmp_path_factory):
  model, path = _built(name, tmp_path_factory)
  cfg, params = models.load_hf(path, scan_layers=scan_layers)
  assert cfg.architecture == model.config.model_type
  assert cfg.vocab_size == VOCAB
  expected = _hf_logits(model, TOKENS_40, MASK_40)
  assert np.abs(expected[MASK_40.astype(bool)]).max() > 1.0  # Not trivial.
  ours, _ = models.apply(cfg, params, TOKENS_40.astype(np.int32),
                         attention_mask=MASK_40)
  diff = _max_diff(ours, expected, MASK_40)
  # `pytest -s` prints the table of docs/models.md.
  print(f"\n{name} scan_layers={scan_layers}: max |logit diff| {diff:.2e}")
  assert diff <= 1e-4
  # The chunked log-prob pass uses the same masks.
  logp = models.token_logprobs(cfg, params, TOKENS_40.astype(np.int32),
                               MASK_40, chunk_size=16)
  shifted = expected[:, :-1] - jax.nn.logsumexp(expected[:, :-1], axis=-1,
                                                keepdims=True)
  want = np.take_along_axis(shifted, TOKENS_40[:, 1:, None], axis=-1)[..., 0]
  context = (MASK_40[:, 1:] * MASK_40[:, :-1]).astype(bool)
  np.testing.assert_allclose(np.asarray(logp)[:, 1:][context], want[context],
                             atol=1e-4)


def test_configs_read_as_intended(tmp_path_factory):
  """The fields each family turns on, from the files transformers wrote."""
  cfgs = {name: models.load_hf(_built(name, tmp_path_factory)[1])[0]
          for name in ("qwen3", "llama3", "llama3_legacy", "yarn",
                       "yarn_legacy", "mistral", "gemma3", "gemma3_legacy")}
  assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_dim == 16
  assert cfgs["llama3"].rope_scaling.rope_type == "llama3"
  assert cfgs["llama3"] == cfgs["llama3_legacy"]
  assert cfgs["yarn"] == cfgs["yarn_legacy"]
  # 0.1 ln(4) + 1, transformers' default YaRN attention factor.
  assert cfgs["yarn"].rope_scaling.attention_factor == pytest.approx(
      1.1386294361)
  assert cfgs["mistral"].layer_kinds == ("sliding", "sliding")
  gemma = cfgs["gemma3"]
  assert gemma == cfgs["gemma3_legacy"]
  assert gemma.layer_kinds == ("sliding", "full", "sliding")
  assert (gemma.sliding_window, gemma.local_rope_theta,
          gemma.rope_theta) == (5, 1e4, 1e6)
  assert gemma.rope_scaling.rope_type == "linear"
  assert gemma.norm_placement == "sandwich" and gemma.rms_scale_offset == 1


def _hf_generate(model, eos_id):
  with torch.no_grad():
    out = model.generate(
        input_ids=torch.tensor(PROMPTS),
        attention_mask=torch.tensor(PROMPT_MASK), max_new_tokens=NEW,
        min_new_tokens=0, do_sample=False, eos_token_id=eos_id,
        pad_token_id=PAD, top_k=None, top_p=None, temperature=None)
  return out.numpy()[:, PROMPTS.shape[1]:]


@pytest.mark.parametrize("name,scan_layers",
                         [pytest.param(name, False, marks=(
                             () if name in _WINDOWED + ("llama3",)
                             else pytest.mark.slow)) for name in FULL] +
                         [pytest.param("gemma3", True,
                                       marks=pytest.mark.slow)])
def test_greedy_generation_matches(name, scan_layers, tmp_path_factory):
  model, path = _built(name, tmp_path_factory)
  cfg, params = models.load_hf(path, scan_layers=scan_layers)
  # An EOS that row 0 emits mid-way and some other row never does, so both
  # finished and truncated rows are compared.
  free = _hf_generate(model, eos_id=None)
  candidates = [t for t in free[0, 1:NEW - 1]
                if any(t not in row for row in free[1:]) and t != PAD]
  assert candidates, f"test setup: no usable EOS in {free}"
  eos_id = int(candidates[0])
  expected = _hf_generate(model, eos_id)
  out = sampler.sample(cfg, params, PROMPTS.astype(np.int32), PROMPT_MASK,
                       jax.random.key(0), max_new_tokens=NEW,
                       temperature=0.0, eos_id=eos_id, pad_id=PAD)
  ours = np.asarray(out.tokens[:, PROMPTS.shape[1]:])
  np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected)
  assert (ours[:, expected.shape[1]:] == PAD).all()
  print(f"\n{name} scan_layers={scan_layers}: greedy tokens match "
        f"({int((expected != PAD).sum())} tokens, {len(expected)} rows)")


@pytest.mark.parametrize("name", FULL)
def test_save_reload_and_transformers_reads_it(name, tmp_path_factory,
                                               tmp_path):
  model, path = _built(name, tmp_path_factory)
  cfg, params = models.load_hf(path, scan_layers=True)
  models.save_hf(str(tmp_path), cfg, params)
  with open(tmp_path / "config.json") as f:
    written = json.load(f)
  assert written["model_type"] == model.config.model_type
  assert written["architectures"] == [type(model).__name__]
  cfg2, params2 = models.load_hf(str(tmp_path), scan_layers=True)
  assert cfg2 == cfg
  ours, _ = models.apply(cfg, params, TOKENS_40.astype(np.int32),
                         attention_mask=MASK_40)
  again, _ = models.apply(cfg2, params2, TOKENS_40.astype(np.int32),
                          attention_mask=MASK_40)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(ours))
  # The per-layer layout reads the same tensors.
  _, flat = models.load_hf(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, flat,
               models.unstack_layers(cfg, params))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
  reloaded.eval()
  assert type(reloaded) is type(model)
  np.testing.assert_array_equal(_hf_logits(reloaded, TOKENS_40, MASK_40),
                                _hf_logits(model, TOKENS_40, MASK_40))


@pytest.mark.parametrize("name", FULL)
def test_bfloat16_checkpoint_loads(name, tmp_path_factory, tmp_path):
  model, _ = _built(name, tmp_path_factory)
  bf16 = copy.deepcopy(model).to(torch.bfloat16)
  bf16.save_pretrained(str(tmp_path), safe_serialization=True)
  with open(tmp_path / "config.json") as f:
    written = json.load(f)
  assert written.get("dtype", written.get("torch_dtype")) == "bfloat16"
  cfg, params = models.load_hf(str(tmp_path))
  assert params["embed"].dtype == np.float32
  # The bf16 weights, run in float32 by both (transformers upcasts on load;
  # `bf16.float()` would keep RoPE tables rounded to bf16).
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32)
  reference.eval()
  expected = _hf_logits(reference, TOKENS_40, MASK_40)
  ours, _ = models.apply(cfg, params, TOKENS_40.astype(np.int32),
                         attention_mask=MASK_40)
  assert _max_diff(ours, expected, MASK_40) <= 1e-4


@pytest.mark.parametrize("name", _cases(FULL, fast=("gemma3",)))
def test_sft_policy_and_value_steps_run(name, tmp_path_factory):
  _, path = _built(name, tmp_path_factory)
  cfg, params = models.load_hf(path)
  tokens = TOKENS_40[:, :12].astype(np.int32)
  mask = MASK_40[:, :12].astype(np.int32)
  tokens[:, :2], mask[:, :2] = PAD, 0  # left padding
  response = np.zeros_like(mask)
  response[:, 6:] = 1
  tx = optax.sgd(1e-3)

  sft = jax.jit(steps.make_sft_step(cfg, tx))
  state, metrics = sft(state_lib.create(params, tx),
                       {"tokens": tokens, "attention_mask": mask,
                        "loss_mask": response})
  assert np.isfinite(float(metrics["loss"])) and float(metrics["loss"]) > 0

  old = np.asarray(models.token_logprobs(cfg, params, tokens, mask))
  rng = np.random.default_rng(0)
  policy = jax.jit(steps.make_policy_step(
      cfg, tx, clip_low=0.2, clip_high=0.2, clip_c=3.0,
      loss_agg_mode="token-mean", kl_coef=0.0, kl_estimator="k1"))
  _, metrics = policy(state, {
      "tokens": tokens, "attention_mask": mask, "response_mask": response,
      "old_logprobs": old - 0.1,
      "advantages": rng.standard_normal(tokens.shape).astype(np.float32)})
  assert np.isfinite(float(metrics["loss"]))

  value_params = models.init_from_backbone(cfg, params, jax.random.key(1))
  value = jax.jit(steps.make_value_step(cfg, tx, clip_range=0.2))
  _, metrics = value(state_lib.create(value_params, tx), {
      "tokens": tokens, "attention_mask": mask, "response_mask": response,
      "old_values": np.zeros(tokens.shape, np.float32),
      "returns": np.ones(tokens.shape, np.float32)})
  assert np.isfinite(float(metrics["value_loss"]))
