"""The benchmarks' agreement checks: equal outputs pass, one wrong element
exits non-zero.

The advantage estimators are compared with fake peer outputs computed by the
naive references of `tests/core/core_reference.py` (verl itself lives in its
own environment); the sampler's greedy check with fakes and, where torch and
transformers are installed, with a tiny model against transformers.
"""

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest

from experiments.benchmarks import advantages
from experiments.benchmarks import sampler as sampler_bench
from tests.core import core_reference as ref


def _inputs(batch=6, length=9, group_size=3, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, length + 1, size=batch)
  lengths[0] = length
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
  is_last = np.arange(length)[None, :] == (lengths - 1)[:, None]
  outcome = np.array([1, 0, 1, 0, 0, 1], np.float32)[:batch]
  ends = (rng.random((batch, length)) < 0.3) | is_last
  return dict(
      mask=mask, group_size=group_size,
      rewards=rng.standard_normal((batch, length)).astype(np.float32) * mask,
      values=rng.standard_normal((batch, length)).astype(np.float32),
      outcome_rewards=np.where(is_last, outcome[:, None], 0).astype(
          np.float32),
      rpp_rewards=(np.where(is_last, outcome[:, None], 0) -
                   0.01 * rng.standard_normal((batch, length))).astype(
                       np.float32) * mask,
      step_end_rewards=np.where(ends & (mask > 0),
                                rng.uniform(-1, 1, (batch, length)),
                                0).astype(np.float32))


def _peer_outputs(x, gamma, lam):
  """What verl's side writes, from the naive references."""
  mask = x["mask"]
  adv, returns = ref.gae_reference(x["rewards"], x["values"], mask, gamma,
                                   lam)
  out = {"gae/advantages": ref.whiten_reference(adv, mask),
         "gae/returns": returns}
  for name in ("grpo", "rloo"):
    scores = x["outcome_rewards"].sum(axis=1)
    group = ref.group_advantages_reference(scores, x["group_size"], name)
    out[f"{name}/advantages"] = group[:, None] * mask
  rpp = ref.discounted_returns_reference(x["rpp_rewards"], mask, 1.0)
  out["reinforce_plus_plus/advantages"] = ref.whiten_reference(rpp, mask)
  out["min_form/returns"] = ref.pure_token_min_reference(
      x["step_end_rewards"], mask)
  return out


def _ours(x, gamma, lam):
  estimators = advantages.our_estimators(x["group_size"], gamma, lam)
  outs = {}
  for name, (fn, keys) in estimators.items():
    out = fn(*[x[k] for k in keys])
    outs[name] = out if isinstance(out, tuple) else (out,)
  return outs


def _rows(ours, peer, mask, tolerance=1e-4):
  return [dict(estimator=name, **advantages.compare_with_peer(
      name, out, peer, mask, tolerance)) for name, out in ours.items()]


def test_estimators_agree_with_the_reference_peer():
  x = _inputs()
  ours, peer = _ours(x, 0.99, 0.95), _peer_outputs(x, 0.99, 0.95)
  rows = _rows(ours, peer, x["mask"])
  assert {r["estimator"] for r in rows} == {
      "gae", "grpo", "rloo", "reinforce_plus_plus", "min_form"}
  for row in rows:
    assert row["agrees"], row
    assert row["max_abs_diff"] < 1e-5, row
  assert rows[0]["max_abs_diff_returns"] < 1e-5
  advantages.check_agreement(rows)  # Returns: nothing disagrees.


@pytest.mark.parametrize("key", ["gae/advantages", "gae/returns",
                                 "grpo/advantages", "rloo/advantages",
                                 "reinforce_plus_plus/advantages",
                                 "min_form/returns"])
def test_one_valid_element_off_exits_non_zero(key):
  x = _inputs()
  ours, peer = _ours(x, 0.99, 0.95), _peer_outputs(x, 0.99, 0.95)
  # The last valid token of row 3, moved by 10x the tolerance.
  b = 3
  t = int(np.flatnonzero(x["mask"][b])[-1])
  peer[key] = peer[key].copy()
  peer[key][b, t] += 1e-3
  rows = _rows(ours, peer, x["mask"])
  name = key.split("/")[0]
  assert [r["estimator"] for r in rows if not r["agrees"]] == [name]
  with pytest.raises(SystemExit, match=name) as raised:
    advantages.check_agreement(rows)
  assert raised.value.code  # A message: the process exits with status 1.
  # The same change on a padded token agrees.
  peer = _peer_outputs(x, 0.99, 0.95)
  padded = int(np.flatnonzero(x["mask"][b] == 0)[0])
  peer[key] = peer[key].copy()
  peer[key][b, padded] += 1.0
  advantages.check_agreement(_rows(ours, peer, x["mask"]))


def test_a_nan_disagrees():
  x = _inputs()
  ours, peer = _ours(x, 0.99, 0.95), _peer_outputs(x, 0.99, 0.95)
  peer["grpo/advantages"] = peer["grpo/advantages"].copy()
  peer["grpo/advantages"][0, 0] = np.nan
  with pytest.raises(SystemExit, match="grpo"):
    advantages.check_agreement(_rows(ours, peer, x["mask"]))


# ------------------------------------------------------------- sampler ---


def test_greedy_agreement_and_its_check_on_fakes():
  prompt = np.array([[5, 6, 7], [0, 8, 9]])
  ours = np.concatenate([prompt, [[1, 2, 3, 4], [4, 3, 2, 1]]], axis=1)
  assert sampler_bench.greedy_agreement(ours, ours.copy(), 3) == 1.0
  theirs = ours.copy()
  theirs[1, 5] = 0  # One generated token of 8 differs.
  assert sampler_bench.greedy_agreement(ours, theirs, 3) == 7 / 8
  other_prompt = ours.copy()
  other_prompt[0, 0] = 1  # The prompt slots are not compared.
  assert sampler_bench.greedy_agreement(ours, other_prompt, 3) == 1.0
  row = dict(size="tiny", batch=2, new_tokens=4, mode="greedy")
  sampled = dict(row, mode="sampled")  # No greedy comparison: not checked.
  sampler_bench.check_greedy_agreement(
      [dict(row, greedy_token_agreement=1.0), sampled], 1.0)
  with pytest.raises(SystemExit, match="0.8750") as raised:
    sampler_bench.check_greedy_agreement(
        [dict(row, greedy_token_agreement=7 / 8), sampled], 1.0)
  assert raised.value.code
  sampler_bench.check_greedy_agreement(
      [dict(row, greedy_token_agreement=7 / 8)], 0.8)


def test_greedy_tokens_equal_transformers_on_a_tiny_model(tmp_path):
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  vocab = 24
  ours, hf, _ = sampler_bench._load_both("test", vocab, str(tmp_path))  # pylint: disable=protected-access
  with flagsaver.flagsaver(prompt_len=6, torch_threads=1):
    row = sampler_bench._bench_config(ours, hf, "test", 4, 8, "greedy",  # pylint: disable=protected-access
                                      vocab, repeats=1)
    assert row["greedy_token_agreement"] == 1.0
    sampler_bench.check_greedy_agreement([row], 1.0)
    # Another model on transformers' side: the check fails.
    with torch.no_grad():
      for p in hf.parameters():
        p.add_(0.5 * torch.randn_like(p))
    row = sampler_bench._bench_config(ours, hf, "test", 4, 8, "greedy",  # pylint: disable=protected-access
                                      vocab, repeats=1)
  assert row["greedy_token_agreement"] < 1.0
  with pytest.raises(SystemExit, match="test B=4 G=8"):
    sampler_bench.check_greedy_agreement([row], 1.0)
