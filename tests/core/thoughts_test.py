"""Tests for rl_rewards.core.thoughts (TP-GRPO thought-level rewards)."""

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import rl_rewards.core as rc
from rl_rewards.core import thoughts
from . import core_reference

_JIT_ADVANTAGES = jax.jit(thoughts.tp_grpo_advantages,
                          static_argnames=("group_size", "estimator"))
_VARIANTS = [thoughts.tp_grpo_advantages, _JIT_ADVANTAGES]

# One group of four: two correct responses (0, 1), two wrong ones (2, 3).
# Row 0: prompt token, 7 steps judged [1 1 | 0 0 0 | 1 1] -> three thoughts.
# Row 1: 2 steps [1 | 0]: the last thought of a correct response is bad.
# Row 2: no prompt, 5 steps [1 1 | 0 | 1 | 0] -> four thoughts.
# Row 3: one wrong step that fills the width (a truncated response).
# Verdicts past each row's last step are junk and must be ignored.
_IDS = np.array([
    [-1, 0, 1, 1, 2, 3, 4, 5, 5, 6, -1, -1],
    [-1, -1, 0, 0, 0, 1, 1, -1, -1, -1, -1, -1],
    [0, 0, 1, 2, 2, 3, 4, 4, -1, -1, -1, -1],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
], np.int32)
_MASK = (_IDS >= 0).astype(np.int32)
_VERDICTS = np.array([
    [1, 1, 0, 0, 0, 1, 1],
    [1, 0, 1, 0, 1, 1, 0],
    [1, 1, 0, 1, 0, 0, 1],
    [0, 1, 1, 1, 0, 1, 1],
], np.float32)
_REWARDS = np.array([1.0, 1.0, 0.0, 0.0], np.float32)


def _tokens(per_thought_row, ids_row):
  """Spreads a row's per-step values over its tokens (0 off-response)."""
  return [per_thought_row[i] if i >= 0 else 0.0 for i in ids_row]


def test_segment_thoughts_hand_computed():
  step_mask = rc.step_mask_from_ids(_IDS, 7)
  out = jax.jit(thoughts.segment_thoughts)(
      np.array(_VERDICTS) * 0.8 + 0.1, _IDS, step_mask)  # Probabilities.
  np.testing.assert_array_equal(out.step_to_thought, [
      [0, 0, 1, 1, 1, 2, 2], [0, 1, -1, -1, -1, -1, -1],
      [0, 0, 1, 2, 3, -1, -1], [0, -1, -1, -1, -1, -1, -1]])
  np.testing.assert_array_equal(out.token_ids, [
      [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1],
      [-1, -1, 0, 0, 0, 1, 1, -1, -1, -1, -1, -1],
      [0, 0, 0, 1, 1, 2, 3, 3, -1, -1, -1, -1],
      [0] * 12])
  np.testing.assert_array_equal(out.good, [
      [1, 0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0],
      [1, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out.mask.sum(axis=1), [3, 2, 4, 1])
  # ±1 verdicts (the oracle's) merge the same way with threshold 0.
  signed = thoughts.segment_thoughts(2 * _VERDICTS - 1, _IDS, step_mask,
                                     threshold=0.0)
  np.testing.assert_array_equal(signed.token_ids, out.token_ids)
  np.testing.assert_array_equal(signed.good, out.good)


def test_capability_adaptive_weight_and_group_accuracy():
  np.testing.assert_allclose(
      thoughts.capability_adaptive_weight(0.25, alpha=2.0), 0.5)
  np.testing.assert_allclose(
      thoughts.capability_adaptive_weight(np.array([0.0, 0.5, 1.0])),
      [0.0, 0.5, 1.0])
  # Groups of 3: 2/3 correct, then 0/3 (rewards ±1 and 0/1 alike).
  acc = thoughts.group_accuracy(np.array([1.0, -1.0, 1.0, 0.0, -1.0, 0.0]), 3)
  np.testing.assert_allclose(acc, [2 / 3] * 3 + [0.0] * 3, atol=1e-7)


@pytest.mark.parametrize("fn", _VARIANTS)
def test_hand_computed_group_of_four(fn):
  # acc_G = 1/2, α = 2 -> r^c = 1. r̂^o = ±0.5 / (std + eps), unbiased
  # std of [1, 1, 0, 0] = sqrt(1/3).
  o = 0.5 / (np.sqrt(1 / 3) + 1e-6)
  out = fn(_VERDICTS, _IDS, _MASK, _REWARDS, 4, alpha=2.0)
  expected = [
      # Thought rewards [+1, −1, (last) 0]: sums from each thought 0, −1, 0.
      _tokens([o, o, o - 1, o - 1, o - 1, o, o], _IDS[0]),
      # [+1, (last) 0]: the good thought gets o + 1, the bad last one o.
      _tokens([o + 1, o], _IDS[1]),
      # Wrong: good thoughts −r̂ = +o, bad ones r̂ = −o, last 0:
      # rewards [o, −o, o, 0] -> sums [o, 0, o, 0] -> advantages below.
      _tokens([0.0, 0.0, -o, 0.0, -o], _IDS[2]),
      _tokens([-o], _IDS[3]),
  ]
  np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("fn", _VARIANTS)
def test_groups_with_equal_outcomes(fn):
  # Groups of two: [1, 1] (acc 1, r̂ = 0, r^c = α = 2), [0, 0] (all zero).
  out = fn(_VERDICTS, _IDS, _MASK, _REWARDS, 2, alpha=2.0)
  expected = [
      _tokens([0.0, 0.0, -2.0, -2.0, -2.0, 0.0, 0.0], _IDS[0]),
      _tokens([2.0, 0.0], _IDS[1]),
      [0.0] * 12, [0.0] * 12]
  np.testing.assert_allclose(out, expected, atol=1e-6)


def test_zero_accuracy_or_alpha_is_outcome_grpo_on_correct_rows():
  outcome = rc.broadcast_to_tokens(
      rc.group_advantages(_REWARDS, 4, estimator="grpo"), _MASK)
  for kwargs in (dict(alpha=0.0), dict(alpha=3.0, accuracy=0.0)):
    out = thoughts.tp_grpo_advantages(_VERDICTS, _IDS, _MASK, _REWARDS, 4,
                                      **kwargs)
    np.testing.assert_allclose(out[:2], outcome[:2], atol=1e-6)
  # A [B] accuracy override is used per sample.
  out = thoughts.tp_grpo_advantages(_VERDICTS, _IDS, _MASK, _REWARDS, 4,
                                    accuracy=np.array([1.0, 0.0, 0.0, 0.0]))
  np.testing.assert_allclose(out[0, 4], outcome[0, 4] - 1.0, atol=1e-6)
  np.testing.assert_allclose(out[1], outcome[1], atol=1e-6)


def _reference(verdicts, ids, mask, rewards, n, alpha, eps=1e-6):
  """TP-GRPO position by position (0.5 thresholds, GRPO outcome)."""
  batch, length = ids.shape
  outcome, acc = np.zeros(batch), np.zeros(batch)
  for g in range(batch // n):
    r = rewards[g * n:(g + 1) * n].astype(np.float64)
    for i in range(n):
      if n == 1:
        outcome[g * n + i] = r[i] / (1 + eps)
      elif r.max() > r.min():
        outcome[g * n + i] = (r[i] - r.mean()) / (r.std(ddof=1) + eps)
      acc[g * n + i] = np.mean(r > 0.5)
  out = np.zeros((batch, length))
  for b in range(batch):
    valid = [t for t in range(length) if mask[b, t] and ids[b, t] >= 0]
    if not valid:
      continue
    labels = [verdicts[b, k] > 0.5 for k in range(ids[b].max() + 1)]
    thought_of_step, thought_good = [], []
    for k, good in enumerate(labels):
      if k == 0 or good != labels[k - 1]:
        thought_good.append(good)
      thought_of_step.append(len(thought_good) - 1)
    r = []
    for j, good in enumerate(thought_good):
      if j == len(thought_good) - 1:
        r.append(0.0)
      elif rewards[b] > 0.5:
        r.append(alpha * acc[b] * (1 if good else -1))
      else:
        r.append(-outcome[b] if good else outcome[b])
    for t in valid:
      out[b, t] = outcome[b] + sum(r[thought_of_step[ids[b, t]]:])
  return out


def _random_case(seed, batch=6, length=14):
  data = core_reference.random_batch(seed, batch=batch, length=length)
  rng = np.random.default_rng(seed + 100)
  verdicts = rng.random((batch, length)).astype(np.float32)
  rewards = rng.integers(0, 2, batch).astype(np.float32)
  return verdicts, data["ids"], data["mask"], rewards


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_matches_reference(seed, group_size):
  verdicts, ids, mask, rewards = _random_case(seed)
  expected = _reference(verdicts, ids, mask, rewards, group_size, alpha=1.5)
  for fn in _VARIANTS:
    actual = fn(verdicts, ids, mask, rewards, group_size, alpha=1.5)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_propositions_one_and_two(seed):
  # When the last thought of a correct response is good (of a wrong one,
  # bad), tokens keep the outcome target: Prop. 1 / Prop. 2.
  verdicts, ids, mask, rewards = _random_case(seed, batch=12)
  alpha = 0.7
  out = np.asarray(_JIT_ADVANTAGES(verdicts, ids, mask, rewards, 3,
                                   alpha=alpha))
  outcome = np.asarray(rc.group_advantages(rewards, 3, estimator="grpo"))
  weight = alpha * np.asarray(thoughts.group_accuracy(rewards, 3))
  checked = 0
  for b in range(ids.shape[0]):
    if ids[b].max() < 0:
      continue
    good = verdicts[b, ids[b]] > 0.5  # Per token.
    last_good = good[mask[b] > 0][-1]
    valid = mask[b] > 0
    if rewards[b] > 0.5 and last_good:
      want = np.where(good, outcome[b], outcome[b] - weight[b])
    elif rewards[b] <= 0.5 and not last_good:
      want = np.where(good, 0.0, outcome[b])
    else:
      continue
    checked += 1
    np.testing.assert_allclose(out[b][valid], want[valid], atol=1e-5)
  assert checked >= 3


def test_padding_invariance():
  verdicts, ids, mask, rewards = _random_case(7)
  base = thoughts.tp_grpo_advantages(verdicts, ids, mask, rewards, 2)
  rng = np.random.default_rng(0)
  pad_t, pad_s = 5, 4
  ids_p = np.pad(ids, ((0, 0), (0, pad_t)), constant_values=-1)
  ids_p = np.where(ids_p < 0, rng.integers(-1, 3, ids_p.shape), ids_p)
  mask_p = np.pad(mask, ((0, 0), (0, pad_t)))
  verdicts_p = np.concatenate(
      [verdicts, rng.random((verdicts.shape[0], pad_s))], axis=1)
  padded = _JIT_ADVANTAGES(verdicts_p, ids_p, mask_p, rewards, 2)
  np.testing.assert_allclose(padded[:, :ids.shape[1]], base, atol=1e-6)
  np.testing.assert_array_equal(padded[:, ids.shape[1]:], 0.0)
  np.testing.assert_array_equal(np.asarray(base)[mask == 0], 0.0)


def test_shard_map_matches_single_device():
  # 16 rows, groups of 4, two rows per device: every group spans devices.
  verdicts, ids, mask, rewards = _random_case(8, batch=16, length=8)
  expected = _JIT_ADVANTAGES(verdicts, ids, mask, rewards, 4)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))
  fn = jax.jit(jax.shard_map(
      lambda *a: thoughts.tp_grpo_advantages(*a, 4, axis_name="data"),
      mesh=mesh, in_specs=P("data"), out_specs=P("data")))
  np.testing.assert_allclose(fn(verdicts, ids, mask, rewards), expected,
                             atol=1e-5)


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="accuracy"):
    thoughts.tp_grpo_advantages(_VERDICTS, _IDS, _MASK, _REWARDS, 4,
                                accuracy=np.ones(2))
  with pytest.raises(ValueError, match="divisible"):
    thoughts.tp_grpo_advantages(_VERDICTS, _IDS, _MASK, _REWARDS, 3)
  with pytest.raises(ValueError, match="alpha"):
    thoughts.capability_adaptive_weight(0.5, alpha=-1.0)
  with pytest.raises(ValueError, match="step_ids"):
    thoughts.tp_grpo_advantages(_VERDICTS, _IDS[:, :5], _MASK, _REWARDS, 4)
  with pytest.raises(ValueError, match="batch size 4, expected 2"):
    thoughts.tp_grpo_advantages(_VERDICTS, _IDS, _MASK, _REWARDS[:2], 2)
  with pytest.raises(ValueError, match="weight"):
    thoughts.thought_rewards(np.ones((4, 3)), np.ones((4, 3)), np.ones(4),
                             np.zeros(4), np.ones(3))
