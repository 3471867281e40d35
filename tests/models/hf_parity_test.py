"""Numerical parity with Hugging Face transformers (Qwen2 and Llama).

Skipped when torch / transformers are not installed (they are not project
dependencies): `pip install torch==2.13.0 'transformers>=4.50,<5.11'`.
"""

import jax
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from rl_rewards import models
from rl_rewards.rollout import sampler

torch = pytest.importorskip(
    "torch", reason="PyTorch is needed for the Hugging Face parity tests.")
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is needed for the Hugging Face parity tests.")

VOCAB, PAD = 40, 0
NEW = 10
# Three left-padded prompts of 6, 4 and 2 tokens.
PROMPTS = np.array([[5, 17, 3, 22, 9, 31],
                    [0, 0, 12, 7, 7, 30],
                    [0, 0, 0, 0, 26, 2]], np.int64)
PROMPT_MASK = (PROMPTS != PAD).astype(np.int64)


def _qwen2():
  return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
      rope_theta=1e4, rms_norm_eps=1e-6, tie_word_embeddings=False,
      max_position_embeddings=128))


def _llama():
  return transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=1, head_dim=16,
      intermediate_size=48, rope_theta=5e5, rms_norm_eps=1e-5,
      tie_word_embeddings=True, max_position_embeddings=128))


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def hf_model(request, tmp_path_factory):
  """A random HF model (weights large enough for peaked logits), saved."""
  torch.manual_seed(0)
  model = {"qwen2": _qwen2, "llama": _llama}[request.param]()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.25)
  model.eval()
  path = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(str(path), safe_serialization=True)
  return model, str(path)


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens),
                 attention_mask=torch.tensor(mask)).logits.numpy()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_logits_match(hf_model, scan_layers):
  model, path = hf_model
  cfg, params = models.load_hf(path, scan_layers=scan_layers)
  assert cfg.scan_layers == scan_layers
  assert cfg.architecture == model.config.model_type
  expected = _hf_logits(model, PROMPTS, PROMPT_MASK)
  ours, _ = models.apply(cfg, params, PROMPTS.astype(np.int32),
                         attention_mask=PROMPT_MASK)
  valid = PROMPT_MASK.astype(bool)
  assert np.abs(expected[valid]).max() > 1.0  # Logits are not trivially 0.
  assert np.abs(np.asarray(ours)[valid] - expected[valid]).max() <= 1e-4


@pytest.mark.parametrize("scan_layers", [False, True])
def test_greedy_generation_matches(hf_model, scan_layers):
  model, path = hf_model
  cfg, params = models.load_hf(path, scan_layers=scan_layers)

  def hf_generate(eos_id):
    with torch.no_grad():
      out = model.generate(
          input_ids=torch.tensor(PROMPTS),
          attention_mask=torch.tensor(PROMPT_MASK), max_new_tokens=NEW,
          min_new_tokens=0, do_sample=False, eos_token_id=eos_id,
          pad_token_id=PAD, top_k=None, top_p=None, temperature=None)
    return out.numpy()[:, PROMPTS.shape[1]:]

  # Pick an EOS that row 0 emits mid-way and some other row never emits, so
  # both finished and truncated rows are compared.
  free = hf_generate(eos_id=VOCAB - 1 if VOCAB - 1 not in PROMPTS else None)
  candidates = [t for t in free[0, 1:NEW - 1]
                if any(t not in row for row in free[1:]) and t != PAD]
  assert candidates, f"test setup: no usable EOS in {free}"
  eos_id = int(candidates[0])
  expected = hf_generate(eos_id)

  out = sampler.sample(cfg, params, PROMPTS.astype(np.int32), PROMPT_MASK,
                       jax.random.key(0), max_new_tokens=NEW,
                       temperature=0.0, eos_id=eos_id, pad_id=PAD)
  ours = np.asarray(out.tokens[:, PROMPTS.shape[1]:])
  # HF stops once every row is done; our tail is padding.
  np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected)
  assert (ours[:, expected.shape[1]:] == PAD).all()
  assert out.truncated.any() and not out.truncated.all()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_save_load_save_round_trip(hf_model, tmp_path, scan_layers):
  model, path = hf_model
  cfg, params = models.load_hf(path, scan_layers=scan_layers)
  models.save_hf(str(tmp_path / "a"), cfg, params)
  cfg_a, params_a = models.load_hf(str(tmp_path / "a"),
                                   scan_layers=scan_layers)
  models.save_hf(str(tmp_path / "b"), cfg_a, params_a)
  for name in ("config.json", "model.safetensors"):
    assert ((tmp_path / "a" / name).read_bytes() ==
            (tmp_path / "b" / name).read_bytes())
  # The original tensors survive unchanged.
  original = safetensors_numpy.load_file(f"{path}/model.safetensors")
  ours = safetensors_numpy.load_file(str(tmp_path / "a" / "model.safetensors"))
  if cfg.tie_word_embeddings:
    original.pop("lm_head.weight", None)
  assert set(original) == set(ours)
  for name, value in original.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  # transformers reads what we wrote and computes the same logits.
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path / "a"))
  reloaded.eval()
  np.testing.assert_array_equal(
      _hf_logits(reloaded, PROMPTS, PROMPT_MASK),
      _hf_logits(model, PROMPTS, PROMPT_MASK))
