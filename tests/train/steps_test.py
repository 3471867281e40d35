"""Step functions against hand-computed losses and gradients.

Two kinds of test per step:

* Injected: `models.token_logprobs` (or `models.apply` for the value head)
  is replaced by a function returning a parameter array, so the loss is a
  function of explicit per-token numbers and, with plain SGD at learning
  rate 1, the parameter change is minus the per-token gradient. Expected
  losses and gradients are worked out by hand (in the comments) or by
  per-token NumPy formulas.
* Model: a tiny decoder; the expected loss and gradient come from
  `jax.value_and_grad` of a naive per-token loop written here, which checks
  the step's wiring (which log-probs, which positions, which mask).

Micro-batched updates equal full-batch ones: see accumulation_test.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_rewards import core
from rl_rewards import models
from rl_rewards.train import state as state_lib
from rl_rewards.train import steps

VOCAB = 13
CFG = models.preset("test", VOCAB).replace(num_layers=1)  # Fast compiles.


@pytest.fixture(scope="module", autouse=True)
def fast_compiles():
  # As in accumulation_test.py: optimisation passes dominate tiny programs.
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture
def injected_logprobs(monkeypatch):
  """`models.token_logprobs` returns `params["logp"]`, [B, T]."""
  monkeypatch.setattr(models, "token_logprobs",
                      lambda cfg, params, tokens, attention_mask=None, **_:
                      params["logp"])


@pytest.fixture
def injected_scores(monkeypatch):
  """`models.apply(..., head="score")` returns `params["scores"]`, [B, T]."""

  def apply(cfg, params, tokens, *, head="lm", **_):
    assert head == "score"
    return params["scores"], None

  monkeypatch.setattr(models, "apply", apply)


def _update(step, params, batch):
  """One jitted update with SGD(1): returns (metrics, gradient pytree)."""
  tx = optax.sgd(1.0)
  new_state, metrics = jax.jit(step(tx))(state_lib.create(params, tx), batch)
  assert float(metrics[next(k for k in metrics if k.endswith("skipped"))]) == 0
  grads = jax.tree.map(lambda old, new: np.asarray(old) - np.asarray(new),
                       params, new_state.params)
  return {k: float(v) for k, v in metrics.items()}, grads


def _tokens(rows, length):
  return {"tokens": np.ones((rows, length), np.int32),
          "attention_mask": np.ones((rows, length), np.int32)}


# ---------------------------------------------------------------- policy --

# TV-6 (docs/algorithms.md): (ρ, A) per response token, ε = 0.2, c = 3.
_RATIOS = np.array([1.3, 0.7, 0.7, 1.3, 5.0])
_ADVANTAGES = np.array([1.0, 1.0, -1.0, -1.0, -1.0])


def _policy_step(**overrides):
  kwargs = dict(clip_low=0.2, clip_high=0.2, clip_c=3.0,
                loss_agg_mode="token-mean", kl_coef=0.0, kl_estimator="k1")
  kwargs.update(overrides)
  return lambda tx: steps.make_policy_step(CFG, tx, **kwargs)


def _clip_case_batch():
  """One row: 2 prompt slots, the 5 TV-6 tokens, 1 padding slot. Prompt and
  padding hold garbage (ρ = e^5, A = 100) that the mask must drop."""
  old = np.array([[-3.0, -3.0, -1.0, -2.0, -0.5, -1.5, -2.5, -3.0]],
                 np.float32)
  log_ratio = np.full((1, 8), 5.0, np.float32)
  log_ratio[0, 2:7] = np.log(_RATIOS)
  adv = np.full((1, 8), 100.0, np.float32)
  adv[0, 2:7] = _ADVANTAGES
  mask = np.array([[0, 0, 1, 1, 1, 1, 1, 0]], np.float32)
  batch = {**_tokens(1, 8), "response_mask": mask, "old_logprobs": old,
           "advantages": adv}
  return {"logp": jnp.asarray(old + log_ratio)}, batch


@pytest.mark.parametrize("clip_high,clip_c,losses,grads", [
    # ℓ = max(−Aρ, −A·clip(ρ, 0.8, 1.2)), dual-clipped at −A·3 for A < 0:
    #   ρ=1.3, A=+1: max(−1.3, −1.2) = −1.2  (clipped: ∂/∂log π = 0)
    #   ρ=0.7, A=+1: max(−0.7, −0.8) = −0.7  (∂ = −Aρ = −0.7)
    #   ρ=0.7, A=−1: max(0.7, 0.8)   = 0.8   (clipped: 0)
    #   ρ=1.3, A=−1: max(1.3, 1.2)   = 1.3   (∂ = −Aρ = 1.3)
    #   ρ=5,   A=−1: min(max(5, 1.2), 3) = 3 (dual clip: 0)
    # token-mean over 5 tokens: loss 3.2/5 = 0.64, gradient ∂/5.
    (0.2, 3.0, [-1.2, -0.7, 0.8, 1.3, 3.0], [0, -0.7, 0, 1.3, 0]),
    # No dual clip: the last token costs 5 and its gradient is −Aρ = 5.
    (0.2, 0.0, [-1.2, -0.7, 0.8, 1.3, 5.0], [0, -0.7, 0, 1.3, 5.0]),
    # Clip-higher ε_high = 0.28: ρ = 1.3 clips to 1.28 on the first token.
    (0.28, 3.0, [-1.28, -0.7, 0.8, 1.3, 3.0], [0, -0.7, 0, 1.3, 0]),
])
def test_policy_clip_cases_hand_computed(injected_logprobs, clip_high,
                                         clip_c, losses, grads):
  params, batch = _clip_case_batch()
  metrics, grad = _update(_policy_step(clip_high=clip_high, clip_c=clip_c),
                          params, batch)
  np.testing.assert_allclose(metrics["loss"], np.sum(losses) / 5, rtol=1e-5)
  np.testing.assert_allclose(metrics["pg_loss"], metrics["loss"])
  want = np.zeros((1, 8))
  want[0, 2:7] = np.array(grads) / 5
  np.testing.assert_allclose(grad["logp"], want, atol=1e-6)
  # The clipped term is the larger on tokens 1 and 3; ppo_kl = mean(−log ρ).
  np.testing.assert_allclose(metrics["clipfrac"], 0.4, rtol=1e-6)
  np.testing.assert_allclose(metrics["ppo_kl"], -np.mean(np.log(_RATIOS)),
                             rtol=1e-5)


def _kl_reference(delta, estimator):
  """(value, ∂value/∂log π) per token, Δ = log π − log π_ref."""
  k3 = np.exp(-delta) + delta - 1
  return {"k1": (delta, np.ones_like(delta)),
          "abs": (np.abs(delta), np.sign(delta)),
          "k2": (0.5 * delta ** 2, delta),
          "k3": (k3, 1 - np.exp(-delta)),
          "k3+": (k3, delta)}[estimator]   # k3's value, k2's gradient.


@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3", "k3+"])
def test_policy_kl_term_hand_computed(injected_logprobs, estimator):
  # ρ = 1 on every token (log π = log π_old), so the surrogate is −A with
  # gradient −A; the KL term β·mean KL(log π, log π_ref) is added to it.
  beta = 0.5
  old = np.array([[-9.0, -1.0, -2.0, -0.5, -1.5]], np.float32)
  adv = np.array([[7.0, 0.5, -1.0, 2.0, 0.0]], np.float32)
  delta = np.array([3.0, 0.4, -0.3, 0.1, 1.2])   # Δ_0 is on the prompt.
  mask = np.array([[0, 1, 1, 1, 1]], np.float32)
  batch = {**_tokens(1, 5), "response_mask": mask, "old_logprobs": old,
           "advantages": adv, "ref_logprobs": old - delta[None]}
  metrics, grad = _update(
      _policy_step(kl_coef=beta, kl_estimator=estimator),
      {"logp": jnp.asarray(old)}, batch)
  kl, dkl = _kl_reference(delta[1:], estimator)
  pg = -np.mean(adv[0, 1:])                       # −(0.5 − 1 + 2 + 0)/4
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)
  np.testing.assert_allclose(metrics["kl"], np.mean(kl), rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], pg + beta * np.mean(kl),
                             rtol=1e-5)
  assert abs(metrics["loss"] - pg) > 1e-2          # The KL term is there.
  want = np.zeros((1, 5))
  want[0, 1:] = (-adv[0, 1:] + beta * dkl) / 4
  np.testing.assert_allclose(grad["logp"], want, atol=1e-6)


def test_policy_without_kl_needs_no_reference(injected_logprobs):
  params, batch = _clip_case_batch()   # No `ref_logprobs` in the batch.
  metrics, _ = _update(_policy_step(kl_coef=0.0, kl_estimator="k3"), params,
                       batch)
  assert "kl" not in metrics
  np.testing.assert_allclose(metrics["loss"], 0.64, rtol=1e-5)


@pytest.mark.parametrize("mode,loss,weights", [
    # TV-5: ℓ = [[1, 2, 3], [4]] on the valid tokens, a third row empty.
    ("token-mean", 10 / 4, [[1 / 4] * 3, [1 / 4]]),
    ("seq-mean-token-sum", (6 + 4) / 2, [[1 / 2] * 3, [1 / 2]]),
    ("seq-mean-token-mean", (2 + 4) / 2, [[1 / 6] * 3, [1 / 2]]),
    ("seq-mean-token-sum-norm", 10 / 3, [[1 / 3] * 3, [1 / 3]]),
])
def test_policy_loss_agg_modes_hand_computed(injected_logprobs, mode, loss,
                                             weights):
  # ρ = 1 and A = −ℓ, so the token loss is ℓ and its gradient −Aρ = ℓ; each
  # mode weighs token (b, t) by w_{b,t}: ∂L/∂log π_{b,t} = ℓ_{b,t}·w_{b,t}.
  # Invalid slots hold A = 50 (and the empty row must not count as a
  # sequence).
  ell = np.array([[0, 1, 2, 3], [0, 4, 0, 0], [0, 0, 0, 0]], np.float32)
  mask = np.array([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  old = np.full((3, 4), -1.0, np.float32)
  batch = {**_tokens(3, 4), "response_mask": mask, "old_logprobs": old,
           "advantages": np.where(mask > 0, -ell, 50.0).astype(np.float32)}
  metrics, grad = _update(_policy_step(loss_agg_mode=mode, loss_scale=3.0),
                          {"logp": jnp.asarray(old)}, batch)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-6)
  want = np.zeros((3, 4))
  want[0, 1:] = ell[0, 1:] * weights[0]
  want[1, 1] = ell[1, 1] * weights[1][0]
  np.testing.assert_allclose(grad["logp"], want, atol=1e-6)


def _ragged_rollout(seed, rows=4, length=8, prompt=3):
  rng = np.random.default_rng(seed)
  batch = {"tokens": rng.integers(1, VOCAB, (rows, length)).astype(np.int32),
           "attention_mask": np.ones((rows, length), np.int32)}
  mask = np.zeros((rows, length), np.float32)
  for b, end in enumerate(rng.integers(prompt + 1, length + 1, rows)):
    mask[b, prompt:end] = 1
    batch["attention_mask"][b, end:] = 0
  batch["attention_mask"][1, 0] = 0              # a left-padded prompt
  batch["response_mask"] = mask
  return batch, rng


def _noisy_params(heads, seed):
  p = models.init_params(CFG, jax.random.key(seed), heads=heads)
  rs = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: x + 0.05 * rs.randn(*x.shape).astype(np.float32), p)


def _assert_close_trees(got, want, rtol=1e-4):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    scale = max(1e-6, float(np.max(np.abs(w))))
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


def test_policy_step_matches_naive_loss_on_a_model():
  # Ratios spread over every branch (clipped either side, dual clip), k3 KL.
  batch, rng = _ragged_rollout(0)
  params = _noisy_params(("lm",), 0)
  logp = np.asarray(models.token_logprobs(CFG, params, batch["tokens"],
                                          batch["attention_mask"]))
  ratios = rng.choice([0.5, 0.9, 1.1, 1.5, 4.0], logp.shape)
  batch["old_logprobs"] = (logp - np.log(ratios)).astype(np.float32)
  batch["advantages"] = rng.choice([-1.5, -0.5, 0.5, 2.0],
                                   logp.shape).astype(np.float32)
  batch["ref_logprobs"] = (logp + 0.3 * rng.standard_normal(
      logp.shape)).astype(np.float32)
  eps_low, eps_high, c, beta = 0.2, 0.28, 3.0, 0.1
  mask = batch["response_mask"]

  def naive_loss(params):
    lp = models.token_logprobs(CFG, params, batch["tokens"],
                               batch["attention_mask"])
    total, count = 0.0, 0
    for b in range(mask.shape[0]):
      for t in range(mask.shape[1]):
        if not mask[b, t]:
          continue
        rho = jnp.exp(lp[b, t] - batch["old_logprobs"][b, t])
        a = float(batch["advantages"][b, t])
        ell = jnp.maximum(-a * rho,
                          -a * jnp.clip(rho, 1 - eps_low, 1 + eps_high))
        if a < 0:
          ell = jnp.minimum(ell, -a * c)
        d = lp[b, t] - batch["ref_logprobs"][b, t]
        total = total + ell + beta * (jnp.exp(-d) + d - 1)
        count += 1
    return total / count

  want_loss, want_grad = jax.value_and_grad(naive_loss)(params)
  metrics, grad = _update(
      _policy_step(clip_high=eps_high, clip_c=c, kl_coef=beta,
                   kl_estimator="k3"), params, batch)
  np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5)
  _assert_close_trees(grad, want_grad)


# ----------------------------------------------------------------- value --


def test_token_values_alignment():
  # V_t, the value of the state before token t, is the score head at t − 1.
  params = _noisy_params(("score",), 1)
  batch, _ = _ragged_rollout(1)
  tokens, attention = batch["tokens"], batch["attention_mask"]
  scores, _ = models.apply(CFG, params, tokens, attention_mask=attention,
                           head="score")
  values = np.asarray(steps.token_values(CFG, params, tokens, attention))
  np.testing.assert_array_equal(values[:, 0], 0.0)
  np.testing.assert_allclose(values[:, 1:], scores[:, :-1], rtol=1e-6)
  # So V_t does not see token t, and V_{t+1} does (compared where position
  # t − 1 is a real token: a padding slot's score is garbage).
  changed = tokens.copy()
  changed[:, 4] = (changed[:, 4] % (VOCAB - 1)) + 1
  other = np.asarray(steps.token_values(CFG, params, changed, attention))
  real = np.pad(attention[:, :-1], ((0, 0), (1, 0))) > 0
  np.testing.assert_allclose(np.where(real, other, 0)[:, :5],
                             np.where(real, values, 0)[:, :5], rtol=1e-6)
  rows = attention[:, 4] > 0
  assert rows.sum() >= 2
  assert np.all(np.abs(other[rows, 5] - values[rows, 5]) > 1e-7)


@pytest.mark.parametrize("clip_range,loss,grads", [
    # Scores s = [9, 1, 2, 2, 7]; V_t = s_{t−1}, so the response tokens
    # t = 2, 3, 4 have V = [1, 2, 2], with returns G = [1.5, 1, 3] and
    # V_old = [1.2, 1, 1], c = 0.5:
    #   t=2: clip(1, 0.7, 1.7) = 1: (1 − 1.5)² = 0.25, ∂/∂V = V − G = −0.5
    #   t=3: clip(2, 0.5, 1.5) = 1.5: max((2−1)², (1.5−1)²) = 1, ∂ = 1
    #   t=4: clip(2, 0.5, 1.5) = 1.5: max((2−3)², (1.5−3)²) = 2.25 (clipped,
    #        ∂ = 0)
    # L = ½·(0.25 + 1 + 2.25)/3 = 0.583333; ∂L/∂s_{t−1} = (V − G)/3.
    (0.5, 0.5 * 3.5 / 3, [0, -0.5 / 3, 1 / 3, 0, 0]),
    # Without clipping t = 4 costs 1 and pulls V down: ∂ = (2 − 3)/3.
    (0.0, 0.5 * 2.25 / 3, [0, -0.5 / 3, 1 / 3, -1 / 3, 0]),
])
def test_value_step_alignment_and_clipping_hand_computed(
    injected_scores, clip_range, loss, grads):
  scores = np.array([[9.0, 1.0, 2.0, 2.0, 7.0]], np.float32)
  batch = {**_tokens(1, 5),
           "response_mask": np.array([[0, 0, 1, 1, 1]], np.float32),
           "returns": np.array([[50, 50, 1.5, 1.0, 3.0]], np.float32),
           "old_values": np.array([[50, 50, 1.2, 1.0, 1.0]], np.float32)}
  metrics, grad = _update(
      lambda tx: steps.make_value_step(CFG, tx, clip_range=clip_range),
      {"scores": jnp.asarray(scores)}, batch)
  np.testing.assert_allclose(metrics["value_loss"], loss, rtol=1e-6)
  np.testing.assert_allclose(grad["scores"], [grads], atol=1e-6)
  np.testing.assert_allclose(metrics["value_clipfrac"],
                             1 / 3 if clip_range else 0.0, rtol=1e-6)


def test_value_step_matches_naive_loss_on_a_model():
  batch, rng = _ragged_rollout(2)
  params = _noisy_params(("score",), 2)
  shape = batch["tokens"].shape
  batch["returns"] = rng.standard_normal(shape).astype(np.float32)
  batch["old_values"] = rng.standard_normal(shape).astype(np.float32)
  mask, clip = batch["response_mask"], 0.2

  def naive_loss(params):
    scores, _ = models.apply(CFG, params, batch["tokens"],
                             attention_mask=batch["attention_mask"],
                             head="score")
    total, count = 0.0, 0
    for b in range(shape[0]):
      for t in range(shape[1]):
        if mask[b, t]:
          v = scores[b, t - 1]          # The state before token t.
          g, old = batch["returns"][b, t], batch["old_values"][b, t]
          total = total + 0.5 * jnp.maximum(
              (v - g) ** 2, (jnp.clip(v, old - clip, old + clip) - g) ** 2)
          count += 1
    return total / count

  want_loss, want_grad = jax.value_and_grad(naive_loss)(params)
  metrics, grad = _update(
      lambda tx: steps.make_value_step(CFG, tx, clip_range=clip), params,
      batch)
  np.testing.assert_allclose(metrics["value_loss"], want_loss, rtol=1e-5)
  _assert_close_trees(grad, want_grad)


# ---------------------------------------------------------- implicit PRM --


def _prime_step(group_size, micro=0):
  return lambda tx: steps.make_implicit_prm_step(
      CFG, tx, beta=0.05, group_size=group_size, micro_batch_size=micro)


def test_implicit_prm_ce_hand_computed(injected_logprobs):
  # Groups of 2. Group 0 is kept, TV-9: Σ log-ratio = [4, −2], β = 0.05,
  # labels [1, 0]: σ(z) = [0.549834, 0.475021], CE = (0.597837 + 0.644700)/2
  # = 0.621268; ∂L/∂log π_{i,t} = −β·m_{i,t}·(y_i − σ(z_i))/2 =
  # [−0.0112541, +0.0118755]. Group 1 was filtered (all-zero mask): it adds
  # nothing (a mean over all 4 rows would be (2·0.621268 + 2·log 2)/4).
  log_ratios = np.array([[1.0, 3.0, 9.0], [-2.0, 0.0, 9.0],
                         [4.0, 4.0, 4.0], [-3.0, 1.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]], np.float32)
  ref = np.full((4, 3), -2.0, np.float32)
  batch = {**_tokens(4, 3), "response_mask": mask, "ref_logprobs": ref,
           "labels": np.array([1.0, 0.0, 1.0, 1.0], np.float32)}
  metrics, grad = _update(_prime_step(2),
                          {"logp": jnp.asarray(ref + log_ratios)}, batch)
  np.testing.assert_allclose(metrics["prm_loss"], 0.621268, atol=1e-6)
  np.testing.assert_allclose(
      grad["logp"], [[-0.0112541] * 2 + [0], [0.0118755] * 2 + [0],
                     [0] * 3, [0] * 3], atol=1e-6)
  # Group 0 ranks right (Q 4 > −2 with label 1 > 0); group 1 does not count.
  np.testing.assert_allclose(metrics["prm_pairwise_accuracy"], 1.0)


@pytest.mark.parametrize("micro", [0, 4])
def test_implicit_prm_filtered_rows_equal_the_batch_without_them(micro):
  # 4 groups of 2; groups 1 and 3 were removed by the accuracy filter (their
  # response mask zeroed, tokens left in place). The update must be that of
  # the 4 kept rows alone, also with micro-batches of 2 groups.
  batch, rng = _ragged_rollout(3, rows=8)
  batch["ref_logprobs"] = (-2.5 + 0.3 * rng.standard_normal(
      batch["tokens"].shape)).astype(np.float32)
  batch["labels"] = np.array([1, 0, 1, 1, 0, 1, 0, 0], np.float32)
  kept = np.array([0, 1, 4, 5])
  small = {k: v[kept] for k, v in batch.items()}
  filtered = dict(batch, response_mask=batch["response_mask"] * np.repeat(
      np.array([1, 0, 1, 0], np.float32), 2)[:, None])
  params = _noisy_params(("lm",), 3)
  want_metrics, want_grad = _update(_prime_step(2), params, small)
  metrics, grad = _update(_prime_step(2, micro), params, filtered)
  for key in ("prm_loss", "prm_pairwise_accuracy"):
    np.testing.assert_allclose(metrics[key], want_metrics[key], rtol=1e-5,
                               err_msg=key)
  _assert_close_trees(grad, want_grad)
  assert want_metrics["prm_loss"] > 0.1
