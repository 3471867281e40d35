"""Non-finite updates of every step type are skipped, counted and survived."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_rewards import config_lib
from rl_rewards import config_presets
from rl_rewards import models
from rl_rewards.runners import programs
from rl_rewards.train import nonfinite
from rl_rewards.train import state as state_lib

B, T, S, V = 4, 16, 4, 24


def _config(spec):
  config = config_presets.apply_size(config_lib.base_config(), "test")
  config.task.max_steps = S
  config.debug.nonfinite_steps = spec
  return config_lib.validate(config)


def _batch(kind):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, V, (B, T)).astype(np.int32)
  ones = np.ones((B, T), np.int32)
  response = np.zeros((B, T), np.float32)
  response[:, T // 2:] = 1.0
  floats = lambda: rng.normal(size=(B, T)).astype(np.float32)
  if kind == "sft":
    return {"tokens": tokens, "attention_mask": ones,
            "loss_mask": response.astype(np.int32)}
  if kind == "policy":
    return {"tokens": tokens, "attention_mask": ones,
            "response_mask": response, "old_logprobs": -np.abs(floats()),
            "advantages": floats()}
  if kind == "value":
    return {"tokens": tokens, "attention_mask": ones,
            "response_mask": response, "old_values": floats(),
            "returns": floats()}
  if kind in ("implicit_prm", "prm_implicit"):
    return {"tokens": tokens, "attention_mask": ones,
            "response_mask": response, "ref_logprobs": -np.abs(floats()),
            "labels": np.array([1, 0, 0, 1], np.float32)}
  step_ids = np.full((B, T), -1, np.int32)
  step_ids[:, T // 2:] = np.repeat(np.arange(S), T // (2 * S))
  return {"tokens": tokens, "attention_mask": ones, "step_ids": step_ids,
          "targets": rng.uniform(size=(B, S)).astype(np.float32),
          "target_mask": np.ones((B, S), np.float32),
          "v_target": np.full((B,), 0.5, np.float32),
          "v_mask": np.ones((B,), np.float32)}


def _step_fn(kind, config, model_config, tx):
  if kind == "sft":
    return programs.sft_step_fn(config, model_config, tx)
  if kind == "policy":
    return programs.policy_step_fn(config, model_config, tx)
  if kind == "value":
    return programs.value_step_fn(config, model_config, tx)
  if kind == "implicit_prm":
    return programs.implicit_prm_step_fn(config, model_config, tx)
  return programs.prm_step_fn(config, model_config, tx,
                              kind="implicit" if kind == "prm_implicit" else
                              "head", group_size=2)


# (test case, `debug.nonfinite_steps` type, mode, model heads).
CASES = [("sft", "sft", "grad_nan", ("lm",)),
         ("policy", "policy", "loss_inf", ("lm",)),
         ("value", "value", "grad_inf", ("score",)),
         ("implicit_prm", "implicit_prm", "loss_nan", ("lm",)),
         ("prm_head", "prm", "grad_nan", ("score",)),
         ("prm_implicit", "prm", "loss_inf", ("lm",))]


@pytest.mark.parametrize("case,step_type,mode,heads", CASES,
                         ids=[c[0] for c in CASES])
def test_injected_update_is_skipped_and_the_run_goes_on(case, step_type, mode,
                                                        heads):
  config = _config(f"{step_type}:2:{mode}")
  model_config = models.preset("test", V)
  tx = programs.rl_optimizer(config.rl, 1e-2)
  params = models.init_params(model_config, jax.random.key(0), heads=heads)
  state = state_lib.create(params, tx)
  step = jax.jit(_step_fn(case, config, model_config, tx))
  batch = _batch(case)
  skipped_key = next(k for k in step(state, batch)[1] if
                     k.endswith("skipped"))

  first, m1 = step(state, batch)
  second, m2 = step(first, batch)    # Update 2: non-finite, skipped.
  third, m3 = step(second, batch)
  assert [float(m[skipped_key]) for m in (m1, m2, m3)] == [0.0, 1.0, 0.0]
  assert [int(s.skipped) for s in (first, second, third)] == [0, 1, 1]
  assert int(third.step) == 3
  for a, b in zip(jax.tree.leaves((first.params, first.opt_state)),
                  jax.tree.leaves((second.params, second.opt_state))):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  changed = [not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(second.params),
                 jax.tree.leaves(third.params))]
  assert any(changed)
  for leaf in jax.tree.leaves(third.params):
    assert np.all(np.isfinite(leaf))


def test_without_a_hit_the_update_is_bit_identical():
  loss = jnp.float32(1.5)
  grads = {"a": jnp.array([-0.0, 2.0, -3.0]), "b": jnp.array([[1.0]])}
  fault = nonfinite.fault_fn([(5, 7, "grad_nan"), (2, 2, "loss_inf")])
  out_loss, out_grads = jax.jit(fault)(jnp.int32(3), loss, grads)
  assert np.asarray(out_loss).tobytes() == np.asarray(loss).tobytes()
  for a, b in zip(jax.tree.leaves(out_grads), jax.tree.leaves(grads)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  hit_loss, hit_grads = jax.jit(fault)(jnp.int32(6), loss, grads)
  assert float(hit_loss) == 1.5 and np.isnan(hit_grads["a"][0])
  assert np.isinf(jax.jit(fault)(jnp.int32(2), loss, grads)[0])
  assert nonfinite.fault_fn([]) is None


def test_guard_stops_after_k_consecutive_skips_naming_stage_and_step():
  guard = nonfinite.SkipGuard("prm", limit=3)
  for step, skipped in ((1, 1.0), (2, 0.0), (3, 1.0), (4, 1.0)):
    guard.observe(step, jnp.float32(skipped))
  assert guard.flush() == 2
  # Resumed with the streak from the checkpoint: one more skip stops it.
  resumed = nonfinite.SkipGuard("prm", limit=3, run=guard.run)
  resumed.observe(5, 1.0)
  with pytest.raises(nonfinite.NonFiniteError,
                     match=r"\[prm\] 3 consecutive updates .*steps 3\.\.5\); "
                     r"stopping at prm step 5"):
    resumed.flush()
  never = nonfinite.SkipGuard("sft", limit=0)
  for step in range(1, 50):
    never.observe(step, 1.0)
  assert never.flush() == 49


@pytest.mark.parametrize("spec", ["sft", "sft:0", "sft:3-1", "rl:2",
                                  "sft:2:loss_zero", "sft:x", "sft:1:2:3"])
def test_bad_injection_specs_name_the_key(spec):
  config = config_presets.apply_size(config_lib.base_config(), "test")
  config.debug.nonfinite_steps = spec
  with pytest.raises(config_lib.ConfigError,
                     match="config.debug.nonfinite_steps"):
    config_lib.validate(config)


def test_injection_specs_parse():
  assert config_lib.nonfinite_steps(" sft:3, policy:2-4:loss_inf,sft:9") == {
      "sft": [(3, 3, "grad_nan"), (9, 9, "grad_nan")],
      "policy": [(2, 4, "loss_inf")]}
  assert config_lib.nonfinite_steps("") == {}
