r"""Training-step throughput: our jitted SFT and policy steps vs PyTorch.

Our side is `train.steps.make_sft_step` and `make_policy_step` (KL to a
reference on, k3 estimator, `loss_agg_mode` token-mean), jitted exactly as
`runners/sft.py` and `runners/rl.py` jit them: in/out shardings of the
`TrainState` from `runners.context.state_shardings`, the batch split over the
mesh's data axes, the state donated; the optimizer is `train.optim` AdamW
with the `config.sft` / `config.rl` hyper-parameters of `base_config()`.

The other side is a plain PyTorch training step on `Qwen2ForCausalLM`
(transformers, SDPA attention) loaded from the same safetensors checkpoint
(written by `save_hf`, read by `load_hf` and `from_pretrained`):
forward, the same loss written in torch, backward, `clip_grad_norm_`,
`torch.optim.AdamW` (fused) with the same learning rate, warm-up, betas,
epsilon and weight decay. Both sides get the same batch (left-padded
prompts, then responses of random length, then right padding; the same
positions, cumsum(mask) - 1), the same masks and, for the policy step, the
same old / reference log-probabilities and advantages:

  SFT:    L = Σ −log π(x_t | x_<t)·m_t / Σ m_t                 (token mean)
  policy: ℓ_t = max(−A ρ_t, −A clip(ρ_t, 1 − ε_lo, 1 + ε_hi)), dual-clipped
          at −A·c for A < 0;  k3_t = e^{−Δ_t} + Δ_t − 1 with Δ = log π −
          log π_ref;  L = Σ (ℓ_t + β·k3_t)·m_t / Σ m_t

Each shape gets two warm-up calls per side (the first is our compile,
reported as "first call"; torch's try 1 thread and all cores, see
--torch_threads), alternating the sides; the losses of the first call (same
weights, same batch) and of the second (after one identical update; the SFT
warm-up makes that update's learning rate 0) are compared, which shows the
two sides compute the same thing. Then `--repeats` timed calls per side,
alternating so that machine noise hits both; reported times are medians.
Tokens/s counts every slot of the [B, T] batch (padding included: both
sides process it). The default shapes (4 x 128 and 8 x 256 at the 42 M
`small` model) keep a run to a few minutes on two idle cores.

On a GPU backend the table adds MFU: model FLOPs per token are 6·N + the
attention term, N the parameters that multiply activations (q/k/v/o, MLP, LM
head; no embedding lookup, biases or norms), attention 12·L·T·Dh·H for the
non-causal convention (every query attends to all T keys) and half that
for the causal one; both are reported, over `--peak_tflops` (989: H100 bf16
dense). `--model=qwen0.5b|qwen1.5b` (Qwen2.5 shapes, random weights) and
`--dtype=bfloat16` are meant for that case; bfloat16 means float32
parameters and optimizer state with bfloat16 activations on both sides
(ours: `ModelConfig.dtype`; torch: autocast).

Needs PyTorch and transformers next to this package (they are not project
dependencies):

  pip install torch==2.13.0 'transformers>=4.50,<5.11'
  python -m experiments.benchmarks.train_step --out=/tmp/train_step.json

On a GPU (add --nocompare_torch where torch has no CUDA):

  python -m experiments.benchmarks.train_step --model=qwen0.5b \
      --dtype=bfloat16 --batch=8 --seq_len=1024 --out=/tmp/train_step.json
"""

import json
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

from experiments.benchmarks import results as results_lib

# Benchmark modules share the name --out (tests import several into one
# process), so each definition may override another.
_OUT = flags.DEFINE_string("out", None, "Where to write the JSON results.",
                           allow_override=True)
_MODEL = flags.DEFINE_string(
    "model", "small", "A preset (test, tiny, small) or qwen0.5b / qwen1.5b "
    "(Qwen2.5 shapes with random weights).")
_VOCAB = flags.DEFINE_integer("vocab_size", 1024,
                              "Vocabulary of the preset models.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Activation dtype (parameters stay float32).")
_SHAPES = flags.DEFINE_list("shapes", ["4x128", "8x256"],
                            "Batch shapes as BxT (sequences x slots).")
_BATCH = flags.DEFINE_integer("batch", None,
                              "With --seq_len: time this one shape only.", allow_override=True)
_SEQ_LEN = flags.DEFINE_integer("seq_len", None,
                                "With --batch: time this one shape only.")
_STEPS = flags.DEFINE_list("steps", ["sft", "policy"],
                           "Which steps to time: sft and/or policy.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per side.", allow_override=True)
_KL_COEF = flags.DEFINE_float("kl_coef", 0.05,
                              "β of the policy step's k3 KL term (> 0).")
_COMPARE_TORCH = flags.DEFINE_bool(
    "compare_torch", True, "Time the PyTorch step too (needs torch and "
    "transformers; on a GPU backend, torch with CUDA).")
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads", 0,
    "PyTorch intra-op threads on CPU; 0 = time one warm-up call with 1 "
    "thread and one with all cores and keep the faster.", allow_override=True)
_NUM_DEVICES = flags.DEFINE_integer(
    "num_devices", 0, "Devices of our data-parallel mesh (0 = all).")
_PEAK_TFLOPS = flags.DEFINE_float(
    "peak_tflops", 989.0, "Peak dense TFLOP/s of one device for MFU "
    "(989 = H100 SXM bf16).")
_TOLERANCE = flags.DEFINE_float(
    "tolerance", None, "Largest relative first-step loss difference "
    "called agreement (default 1e-4 in float32, 3e-2 in bfloat16).", allow_override=True)

_PAD = 0

# Qwen2.5 shapes (public config.json values).
QWEN_SHAPES = {
    "qwen0.5b": dict(hidden_size=896, num_layers=24, num_heads=14,
                     num_kv_heads=2, head_dim=64, intermediate_size=4864),
    "qwen1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12,
                     num_kv_heads=2, head_dim=128, intermediate_size=8960),
}
QWEN_VOCAB = 151936


def model_config(name: str, vocab_size: int, dtype: str, seq_len: int):
  """The `ModelConfig` of a preset or a Qwen2.5 size, long enough for T."""
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  if name in QWEN_SHAPES:
    cfg = models.ModelConfig(
        vocab_size=QWEN_VOCAB, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=True,
        max_position_embeddings=32768, **QWEN_SHAPES[name])
  else:
    cfg = models.preset(name, vocab_size)
  return cfg.replace(
      dtype=dtype,
      max_position_embeddings=max(cfg.max_position_embeddings, seq_len))


def matmul_params(cfg) -> int:
  """N: parameters that multiply activations, per token.

  N = L·(D·H·Dh + 2·D·KVH·Dh + H·Dh·D + 3·D·F) + D·V: the attention
  projections and SwiGLU MLP of every layer and the LM head (counted once
  also when tied: the head is a matmul, the embedding a lookup). Biases and
  norm scales (elementwise) and the embedding lookup are left out.
  """
  d, f = cfg.hidden_size, cfg.intermediate_size
  q_out = cfg.num_heads * cfg.head_dim
  kv_out = cfg.num_kv_heads * cfg.head_dim
  per_layer = d * q_out + 2 * d * kv_out + q_out * d + 3 * d * f
  return cfg.num_layers * per_layer + d * cfg.vocab_size


def flops_per_token(cfg, seq_len: int) -> dict:
  """Training FLOPs per token (forward + backward) in both conventions.

    non-causal: 6·N + 12·L·T·Dh·H   (QKᵀ and A·V: 2·2·T·Dh·H forward, ×3)
    causal:     6·N + 6·L·T·Dh·H    (each query sees T/2 keys on average)

  Args:
    cfg: the model config (N from `matmul_params`).
    seq_len: T, slots per sequence.

  Returns:
    {"noncausal": float, "causal": float, "dense": 6·N}.
  """
  dense = 6 * matmul_params(cfg)
  attention = 12 * cfg.num_layers * seq_len * cfg.head_dim * cfg.num_heads
  return {"noncausal": float(dense + attention),
          "causal": float(dense + attention / 2), "dense": float(dense)}


def dense_floor_fn(cfg, batch: int, seq_len: int):
  """A jitted fn(params) -> grads doing only the step's dense matmuls.

  Forward: every layer's q/k/v/o projections and MLP matmuls on [B·T, D]
  and the LM head, mixed by additions only (no attention, norms, RoPE,
  softmax or loss); backward: `jax.grad` of the sum of the logits, i.e. the
  input and weight gradients of each of those matmuls. No optimizer. Its
  time is a lower bound for a training step built on these matmuls on the
  same backend (the "dense floor"); its FLOPs are 6·N per token.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  d = cfg.hidden_size

  def forward(weights, x):
    for i in range(cfg.num_layers):
      attention = weights[f"layers_{i}"]["attention"]
      mlp = weights[f"layers_{i}"]["mlp"]
      q, k, v = (x @ attention[f"{n}_kernel"].reshape(d, -1)
                 for n in ("q", "k", "v"))
      mixed = q + jnp.tile(k + v, (1, q.shape[1] // k.shape[1]))
      x = x + mixed @ attention["o_kernel"].reshape(-1, d)
      x = x + ((x @ mlp["gate_kernel"]) * (x @ mlp["up_kernel"])
               ) @ mlp["down_kernel"]
    head = (weights["embed"].T if cfg.tie_word_embeddings
            else weights["lm_head"])
    return jnp.sum(x @ head)

  @jax.jit
  def run(params):
    weights = {k: v for k, v in params.items()
               if k.startswith("layers_") or k in ("embed", "lm_head")}
    x = jnp.full((batch * seq_len, d), 0.01, jnp.float32)
    return jax.grad(forward, argnums=(0, 1))(weights, x)
  return run


def mfu(tokens_per_s: float, flops: float, peak_tflops: float) -> float:
  """Model FLOPs utilisation: tokens/s · FLOPs/token / (peak · 1e12)."""
  return tokens_per_s * flops / (peak_tflops * 1e12)


def make_batch(batch: int, seq_len: int, vocab_size: int, seed: int) -> dict:
  """A [B, T] host batch in the layout of docs/data_model.md (numpy).

  Prompt slots (T/4, each row left-padded by 0..T/12) then response slots
  (each row keeps T/8 .. all of them, then right padding). Tokens are random
  ids in [1, V); `loss_mask` = `response_mask` = the kept response slots;
  `advantages` are one N(0, 1) value per row on its response.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  prompt_len = seq_len // 4
  slot = np.arange(seq_len)[None]
  pads = rs.randint(0, prompt_len // 3 + 1, (batch, 1))
  response_len = rs.randint(max((seq_len - prompt_len) // 8, 1),
                            seq_len - prompt_len + 1, (batch, 1))
  response = (slot >= prompt_len) & (slot < prompt_len + response_len)
  attention = ((slot >= pads) & (slot < prompt_len)) | response
  tokens = np.where(attention, rs.randint(1, vocab_size, (batch, seq_len)),
                    _PAD)
  advantages = rs.randn(batch, 1) * response
  return {"tokens": tokens.astype(np.int32),
          "attention_mask": attention.astype(np.int32),
          "loss_mask": response.astype(np.int32),
          "response_mask": response.astype(np.int32),
          "advantages": advantages.astype(np.float32)}


def add_old_and_ref_logprobs(batch: dict, logprobs, seed: int) -> dict:
  """Adds `old_logprobs` and `ref_logprobs`: the policy's log-probs plus
  N(0, 0.3²) noise on response slots (so ratios are clipped on both sides
  of 1 and the KL is not 0), 0 elsewhere."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  mask = batch["response_mask"].astype(bool)
  out = dict(batch)
  for name in ("old_logprobs", "ref_logprobs"):
    noisy = logprobs + 0.3 * rs.randn(*logprobs.shape)
    out[name] = np.where(mask, noisy, 0.0).astype(np.float32)
  return out


def step_batch(kind: str, cfg, params, batch: int, seq_len: int) -> dict:
  """The host batch a step kind reads: `make_batch(batch, seq_len, V,
  seed=seq_len)`, with the policy's own log-probabilities made into
  `old_logprobs` / `ref_logprobs` for the policy step
  (`add_old_and_ref_logprobs`), keyed by `batch_keys(kind)`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  host = make_batch(batch, seq_len, cfg.vocab_size, seed=seq_len)
  if kind == "policy":
    logp = models.token_logprobs(cfg, params, host["tokens"],
                                 host["attention_mask"])
    host = add_old_and_ref_logprobs(host, np.asarray(logp), seed=seq_len)
  return {k: host[k] for k in batch_keys(kind)}


def optimizer_settings(kind: str) -> dict:
  """Keyword arguments of `optim.make_optimizer`: those the stage's runner
  passes from `base_config()`, and its defaults for the rest (b1, eps)."""
  import inspect  # pylint: disable=g-import-not-at-top
  from rl_rewards import config_lib  # pylint: disable=g-import-not-at-top
  from rl_rewards.train import optim  # pylint: disable=g-import-not-at-top
  section = config_lib.base_config()["sft" if kind == "sft" else "rl"]
  defaults = inspect.signature(optim.make_optimizer).parameters
  return dict(learning_rate=section.learning_rate,
              warmup_steps=section.warmup_steps,
              weight_decay=section.weight_decay, b1=defaults["b1"].default,
              b2=section.b2, eps=defaults["eps"].default,
              grad_clip=section.grad_clip)


def policy_settings(kl_coef: float) -> dict:
  """The policy loss settings: `config.rl`'s clip values, token-mean, k3."""
  from rl_rewards import config_lib  # pylint: disable=g-import-not-at-top
  rl = config_lib.base_config().rl
  return dict(clip_low=rl.clip_low, clip_high=rl.clip_high, clip_c=rl.clip_c,
              loss_agg_mode="token-mean", kl_coef=kl_coef, kl_estimator="k3")


def batch_keys(kind: str) -> tuple:
  if kind == "sft":
    return ("tokens", "attention_mask", "loss_mask")
  return ("tokens", "attention_mask", "response_mask", "old_logprobs",
          "advantages", "ref_logprobs")


def jit_step(kind: str, cfg, params, mesh, *, kl_coef: float, seq_len: int,
             micro_batch_size: int = 0):
  """Our step, jitted as the runners jit it.

  Args:
    kind: "sft" or "policy".
    cfg: model config.
    params: parameters (arrays or `ShapeDtypeStruct`s).
    mesh: the device mesh.
    kl_coef: β of the policy step.
    seq_len: T (the policy step's `loss_scale`, unused by token-mean).
    micro_batch_size: rows per micro-batch (0: the whole batch).

  Returns:
    (jitted `(state, batch) -> (state, metrics)`, optax transformation,
    `TrainState` shardings).
  """
  from rl_rewards.runners import context  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import programs  # pylint: disable=g-import-not-at-top
  from rl_rewards.train import optim  # pylint: disable=g-import-not-at-top
  from rl_rewards.train import steps  # pylint: disable=g-import-not-at-top

  tx = optim.make_optimizer(**optimizer_settings(kind))
  if kind == "sft":
    fn = steps.make_sft_step(cfg, tx, micro_batch_size=micro_batch_size)
  elif kind == "policy":
    fn = steps.make_policy_step(cfg, tx, loss_scale=float(seq_len),
                                micro_batch_size=micro_batch_size,
                                **policy_settings(kl_coef))
  else:
    raise ValueError(f"Unknown step {kind!r}; expected sft or policy.")
  shardings = context.state_shardings(params, cfg, mesh, tx)
  return programs.jit_update(fn, shardings, mesh), tx, shardings


def abstract_inputs(kind: str, cfg, tx, batch: int, seq_len: int):
  """`ShapeDtypeStruct`s of (state, batch) for `jax.eval_shape` of a step."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.train import state as state_lib  # pylint: disable=g-import-not-at-top

  state = jax.eval_shape(lambda p: state_lib.create(p, tx),
                         models.abstract_params(cfg))
  ints = ("tokens", "attention_mask", "loss_mask", "response_mask")
  arrays = {k: jax.ShapeDtypeStruct(
      (batch, seq_len), jnp.int32 if k in ints else jnp.float32)
            for k in batch_keys(kind)}
  return state, arrays


def _torch_logprobs(model, tokens, mask, positions, autocast):
  """[B, T] log π(x_t | x_<t), 0 where the token or its context is padding
  (our `models.token_logprobs`), from HF logits and a fused cross-entropy."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  with autocast():
    logits = model(input_ids=tokens, attention_mask=mask,
                   position_ids=positions, use_cache=False).logits
  b, t, v = logits.shape
  logp = -F.cross_entropy(logits[:, :-1].reshape(-1, v).float(),
                          tokens[:, 1:].reshape(-1), reduction="none")
  valid = mask.bool()
  has_context = valid[:, 1:] & valid[:, :-1]
  logp = torch.where(has_context, logp.view(b, t - 1), 0.0)
  return F.pad(logp, (1, 0))


def _torch_masked_mean(x, mask):
  return (x * mask).sum() / mask.sum().clamp(min=1.0)


class TorchStep:
  """The PyTorch training step: loss, backward, clip, AdamW, schedule."""

  def __init__(self, model, kind, settings, policy, device, dtype):
    import contextlib  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    self.model, self.kind, self.policy = model, kind, policy
    self.device = device
    self.grad_clip = settings["grad_clip"]
    adamw = dict(lr=settings["learning_rate"],
                 betas=(settings["b1"], settings["b2"]), eps=settings["eps"],
                 weight_decay=settings["weight_decay"])
    try:
      self.opt = torch.optim.AdamW(model.parameters(), fused=True, **adamw)
      self.fused = True
    except (RuntimeError, TypeError):
      self.opt = torch.optim.AdamW(model.parameters(), **adamw)
      self.fused = False
    warmup = settings["warmup_steps"]
    self.schedule = torch.optim.lr_scheduler.LambdaLR(
        self.opt, lambda k: min(k / warmup, 1.0) if warmup > 0 else 1.0)
    if dtype == "bfloat16":
      self.autocast = lambda: torch.autocast(device.split(":")[0],
                                             dtype=torch.bfloat16)
    else:
      self.autocast = contextlib.nullcontext

  def loss(self, batch):
    """(loss, parts dict) of a batch of torch tensors."""
    import torch  # pylint: disable=g-import-not-at-top
    mask = batch["attention_mask"]
    positions = (torch.cumsum(mask, -1) - 1).clamp(min=0)
    logp = _torch_logprobs(self.model, batch["tokens"], mask, positions,
                           self.autocast)
    if self.kind == "sft":
      loss = _torch_masked_mean(-logp, batch["loss_mask"].float())
      return loss, {}
    p = self.policy
    m = batch["response_mask"].float()
    adv = batch["advantages"]
    ratio = torch.exp(torch.clamp(logp - batch["old_logprobs"], -20.0, 20.0))
    token = torch.maximum(
        -adv * ratio,
        -adv * torch.clamp(ratio, 1 - p["clip_low"], 1 + p["clip_high"]))
    if p["clip_c"] > 0:
      token = torch.where(adv < 0, torch.minimum(token, -adv * p["clip_c"]),
                          token)
    pg_loss = _torch_masked_mean(token, m)
    neg = torch.clamp(-(logp - batch["ref_logprobs"]), -20.0, 20.0)
    kl = _torch_masked_mean(torch.clamp(torch.exp(neg) - neg - 1, -10, 10), m)
    return pg_loss + p["kl_coef"] * kl, {"pg_loss": pg_loss, "kl": kl}

  def __call__(self, batch):
    import torch  # pylint: disable=g-import-not-at-top
    loss, parts = self.loss(batch)
    loss.backward()
    if self.grad_clip > 0:
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
    self.opt.step()
    self.schedule.step()
    self.opt.zero_grad(set_to_none=True)
    if self.device.startswith("cuda"):
      torch.cuda.synchronize()
    return {"loss": loss.detach(), **{k: v.detach() for k, v in parts.items()}}


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def _bench_shape(kind, loaded, mesh, batch_size, seq_len, options):
  """Times one step kind at one shape on both sides; returns a row dict."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top
  from rl_rewards.runners import context  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  cfg, params, hf_path = loaded
  host = step_batch(kind, cfg, params, batch_size, seq_len)
  step, tx, _ = jit_step(kind, cfg, params, mesh, kl_coef=options["kl_coef"],
                         seq_len=seq_len)
  state, _ = context.create_state(cfg, mesh, params, tx)
  batch = mesh_lib.put_batch(host, mesh)
  holder = {"state": state}

  def run_ours():
    holder["state"], metrics = step(holder["state"], batch)
    return jax.block_until_ready(metrics)

  torch_step = _make_torch_step(kind, hf_path, host, options)
  ours_losses, torch_losses = [], []
  ours_times, torch_times = [], []
  candidates = options["torch_threads"]
  first_call, warmup = {}, []
  # Warm-up, alternating the sides: at least two calls each (the first is
  # our compile), torch's with each thread-count candidate in turn; the
  # faster count is kept.
  for i in range(max(2, len(candidates))):
    seconds, metrics = _timed(run_ours)
    first_call.setdefault("ours", seconds)
    ours_losses.append(context.host_scalars(metrics))
    if torch_step is not None:
      threads = candidates[min(i, len(candidates) - 1)]
      _set_torch_threads(threads)
      seconds, metrics = _timed(lambda: torch_step(torch_step.batch))
      first_call.setdefault("torch", seconds)
      torch_losses.append({k: float(v) for k, v in metrics.items()})
      warmup.append((seconds, threads))
  if torch_step is not None:
    _set_torch_threads(min(warmup)[1])
  floor = dense_floor_fn(cfg, batch_size, seq_len)
  run_floor = lambda: jax.block_until_ready(floor(params))
  run_floor()
  floor_times = []
  for _ in range(options["repeats"]):  # Alternate the sides.
    floor_times.append(_timed(run_floor)[0])
    seconds, metrics = _timed(run_ours)
    ours_times.append(seconds)
    ours_losses.append(context.host_scalars(metrics))
    if torch_step is not None:
      seconds, metrics = _timed(lambda: torch_step(torch_step.batch))
      torch_times.append(seconds)
      torch_losses.append({k: float(v) for k, v in metrics.items()})

  tokens = batch_size * seq_len
  flops = flops_per_token(cfg, seq_len)
  row = {
      "step": kind, "model": options["model"], "dtype": cfg.dtype,
      "batch": batch_size, "seq_len": seq_len, "tokens": tokens,
      "loss_tokens": int(host["loss_mask" if kind == "sft" else
                              "response_mask"].sum()),
      "params": models.num_params(cfg), "matmul_params": matmul_params(cfg),
      "flops_per_token_causal": flops["causal"],
      "flops_per_token_noncausal": flops["noncausal"],
      "backend": jax.default_backend(), "devices": mesh.devices.size,
      "ours_s": statistics.median(ours_times), "ours_times_s": ours_times,
      "ours_first_call_s": first_call["ours"],
      "ours_losses": [x["loss"] for x in ours_losses],
  }
  row["ours_tok_s"] = tokens / row["ours_s"]
  row["dense_floor_s"] = statistics.median(floor_times)
  row["floor_tok_s"] = tokens / row["dense_floor_s"]
  row["ours_over_floor"] = row["ours_s"] / row["dense_floor_s"]
  if torch_step is not None:
    row.update({
        "torch_s": statistics.median(torch_times),
        "torch_times_s": torch_times,
        "torch_first_call_s": first_call["torch"],
        "torch_losses": [x["loss"] for x in torch_losses],
        "torch_threads": _get_torch_threads(),
        "torch_device": torch_step.device,
        "torch_fused_adamw": torch_step.fused,
    })
    row["torch_tok_s"] = tokens / row["torch_s"]
    row["ratio"] = row["ours_tok_s"] / row["torch_tok_s"]
    row["torch_over_floor"] = row["torch_s"] / row["dense_floor_s"]
    row.update(loss_agreement(ours_losses, torch_losses, options["tolerance"]))
  if jax.default_backend() != "cpu":
    row.update(mfu_fields(row, flops, options["peak_tflops"]))
  return row


def mfu_fields(row: dict, flops: dict, peak_tflops: float) -> dict:
  """`{side}_mfu_{causal,noncausal}` for each side with `{side}_tok_s` in
  `row`, from `flops_per_token`'s dict, and `peak_tflops`."""
  out = {"peak_tflops": peak_tflops}
  for side in ("ours", "torch"):
    if f"{side}_tok_s" in row:
      for convention in ("causal", "noncausal"):
        out[f"{side}_mfu_{convention}"] = mfu(
            row[f"{side}_tok_s"], flops[convention], peak_tflops)
  return out


def loss_agreement(ours, theirs, tolerance):
  """Loss agreement of the first call (and of the second, after one
  update), per loss part both sides report."""
  out = {}
  for call, label in ((0, "first"), (1, "second")):
    for name in theirs[call]:
      a, b = ours[call][name], theirs[call][name]
      key = f"{label}_step_{name}"
      out[f"{key}_ours"], out[f"{key}_torch"] = a, b
      out[f"{key}_abs_diff"] = abs(a - b)
      out[f"{key}_rel_diff"] = abs(a - b) / max(abs(a), abs(b), 1e-12)
  out["loss_tolerance"] = tolerance
  out["first_step_losses_agree"] = all(
      out[f"first_step_{name}_rel_diff"] <= tolerance for name in theirs[0])
  return out


def _set_torch_threads(threads):
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)


def _get_torch_threads():
  import torch  # pylint: disable=g-import-not-at-top
  return torch.get_num_threads()


def _make_torch_step(kind, hf_path, host, options):
  """The PyTorch step with its model and batch, or None when not compared."""
  if hf_path is None:
    return None
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  device = options["torch_device"]
  model = transformers.Qwen2ForCausalLM.from_pretrained(
      hf_path, dtype=torch.float32, attn_implementation="sdpa").to(device)
  model.train()
  step = TorchStep(model, kind, optimizer_settings(kind),
                   policy_settings(options["kl_coef"]), device,
                   options["dtype"])
  step.batch = {
      k: torch.tensor(v, device=device).long() if v.dtype.kind == "i"
      else torch.tensor(v, device=device) for k, v in host.items()}
  return step


def _load(options, workdir):
  """(model config, our params, HF checkpoint path or None)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards import models  # pylint: disable=g-import-not-at-top

  longest = max(t for _, t in options["shapes"])
  cfg = model_config(options["model"], options["vocab_size"], options["dtype"],
                     longest)
  params = models.init_params(cfg, jax.random.key(0))
  if options["torch_device"] is None:
    return cfg, params, None
  path = os.path.join(workdir, options["model"])
  models.save_hf(path, cfg, params)
  del params
  cfg, params = models.load_hf(path, dtype=options["dtype"])
  return cfg, params, path


def _torch_device(compare: bool):
  """Where the PyTorch step runs: "cpu", "cuda", or None (not compared)."""
  import jax  # pylint: disable=g-import-not-at-top
  if not compare:
    return None
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise SystemExit(f"The PyTorch side needs torch and transformers ({e}); "
                     "see the module docstring, or pass --nocompare_torch."
                     ) from None
  if jax.default_backend() == "cpu":
    return "cpu"
  if torch.cuda.is_available():
    return "cuda"
  raise SystemExit(f"Our backend is {jax.default_backend()} but torch has no "
                   "CUDA device; pass --nocompare_torch to time ours only.")


def print_table(rows):
  """Prints the results as a markdown table (MFU columns on a GPU)."""
  gpu = any("peak_tflops" in r for r in rows)
  header = ("| step | model | dtype | B x T | ours tok/s | torch tok/s | "
            "ratio | dense floor tok/s | ours / floor | torch / floor | "
            "ours first call s | torch first call s | "
            "first-step loss ours / torch (rel diff) | torch threads |")
  mfu_keys = [f"{side}_mfu_{c}" for side in ("ours", "torch")
              for c in ("causal", "noncausal")]
  if gpu:
    header += (" ours MFU causal | ours MFU non-causal | torch MFU causal | "
               "torch MFU non-causal |")
  print(header)
  print("|" + "---|" * header[1:].count("|"))
  for r in rows:
    line = (f"| {r['step']} | {r['model']} | {r['dtype']} | "
            f"{r['batch']} x {r['seq_len']} | {r['ours_tok_s']:,.0f} | ")
    floor = (f"{r['floor_tok_s']:,.0f} | {r['ours_over_floor']:.2f} | "
             if "floor_tok_s" in r else "- | - | ")
    if "torch_tok_s" in r:
      line += (f"{r['torch_tok_s']:,.0f} | {r['ratio']:.2f}x | {floor}"
               f"{r['torch_over_floor']:.2f} | "
               f"{r['ours_first_call_s']:.1f} | "
               f"{r['torch_first_call_s']:.1f} | "
               f"{r['first_step_loss_ours']:.6f} / "
               f"{r['first_step_loss_torch']:.6f} "
               f"({r['first_step_loss_rel_diff']:.1e}) | "
               f"{r['torch_threads']} |")
    else:
      line += (f"- | - | {floor}- | {r['ours_first_call_s']:.1f} | - | "
               f"{r['ours_losses'][0]:.6f} / - | - |")
    if gpu:
      line += "".join(f" {r[k]:.1%} |" if k in r else " - |"
                      for k in mfu_keys)
    print(line)
  compared = [r for r in rows if "first_step_losses_agree" in r]
  if compared:
    agree = all(r["first_step_losses_agree"] for r in compared)
    print(f"First-step losses agree within a relative "
          f"{compared[0]['loss_tolerance']:.0e}: {'yes' if agree else 'NO'}.")
  if gpu:
    print(f"MFU over a peak of {rows[0]['peak_tflops']:g} TFLOP/s; model "
          "FLOPs/token = 6N + attention, causal 6·L·T·Dh·H, non-causal "
          "12·L·T·Dh·H.")


def _thread_candidates(torch_device, threads):
  """PyTorch thread counts to try in the warm-up (the faster is kept)."""
  if torch_device is None:
    return [None]
  if threads:
    return [threads]
  if torch_device == "cpu":
    return sorted({1, os.cpu_count() or 1}, reverse=True)
  return [_get_torch_threads()]


def _parse_shapes(shapes, batch, seq_len):
  if (batch is None) != (seq_len is None):
    raise SystemExit("--batch and --seq_len go together.")
  if batch is not None:
    return [(batch, seq_len)]
  out = []
  for text in shapes:
    b, _, t = text.lower().partition("x")
    if not (b.isdigit() and t.isdigit()):
      raise SystemExit(f"--shapes: expected BxT such as 8x256, got {text!r}.")
    out.append((int(b), int(t)))
  return out


def run(options: dict) -> dict:
  """Runs the benchmark described by `options` (the flags); returns the
  results ({"rows": [...], ...}) and prints the table."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_rewards.sharding import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  for kind in options["steps"]:
    if kind not in ("sft", "policy"):
      raise SystemExit(f"--steps: unknown step {kind!r} (sft, policy).")
  if options["kl_coef"] <= 0:
    raise SystemExit("--kl_coef must be > 0 (the policy step runs with KL).")
  devices = jax.devices()
  if options["num_devices"]:
    devices = devices[:options["num_devices"]]
  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, devices)
  for b, _ in options["shapes"]:
    mesh_lib.check_batch_divides(b, mesh, "--shapes")
  options = dict(options, torch_device=_torch_device(options["compare_torch"]))
  if options["tolerance"] is None:
    options["tolerance"] = 1e-4 if options["dtype"] == "float32" else 3e-2
  options["torch_threads"] = _thread_candidates(options["torch_device"],
                                                options["torch_threads"])
  rows = []
  with tempfile.TemporaryDirectory() as workdir, mesh_lib.activate(mesh):
    loaded = _load(options, workdir)
    for batch, seq_len in options["shapes"]:
      for kind in options["steps"]:
        row = _bench_shape(kind, loaded, mesh, batch, seq_len, options)
        rows.append(row)
        print(json.dumps(row), flush=True)
  print(f"\nbackend: {jax.default_backend()}, devices: {len(devices)}, "
        f"cpus: {os.cpu_count()}")
  print_table(rows)
  return {"rows": rows, "cpu_count": os.cpu_count(),
          "backend": jax.default_backend()}


def main(argv):
  del argv
  options = {
      "model": _MODEL.value, "vocab_size": _VOCAB.value, "dtype": _DTYPE.value,
      "shapes": _parse_shapes(_SHAPES.value, _BATCH.value, _SEQ_LEN.value),
      "steps": _STEPS.value, "repeats": _REPEATS.value,
      "kl_coef": _KL_COEF.value, "compare_torch": _COMPARE_TORCH.value,
      "torch_threads": _TORCH_THREADS.value,
      "num_devices": _NUM_DEVICES.value, "peak_tflops": _PEAK_TFLOPS.value,
      "tolerance": _TOLERANCE.value,
  }
  start = results_lib.started()
  results = run(options)
  if _OUT.value:
    results_lib.write(_OUT.value, results, start)
  check_loss_agreement(results["rows"])


def check_loss_agreement(rows):
  """Exits non-zero when a side-by-side row's first-step losses disagree:
  the two sides then did not run the same step, and its speed ratio means
  nothing."""
  disagree = [f"{r['step']} {r['batch']}x{r['seq_len']}" for r in rows
              if not r.get("first_step_losses_agree", True)]
  if disagree:
    raise SystemExit(
        f"First-step losses of ours and PyTorch's disagree beyond a relative "
        f"{rows[0]['loss_tolerance']:.0e} on: {', '.join(disagree)}.")


if __name__ == "__main__":
  app.run(main)
