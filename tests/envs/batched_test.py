"""Tests of BatchedEnv: rows, limits, failures and contract errors."""

import numpy as np
import pytest

from rl_rewards import errors
from rl_rewards.envs import batched
from rl_rewards.tasks import verifiers
from tests.envs import scripted_envs


def _envs(**kwargs):
  return batched.BatchedEnv(lambda: scripted_envs.CountingEnv(length=2),
                            **kwargs)


class TestInline:

  def test_rows_keep_their_own_state(self):
    env = _envs()
    assert env.reset(["a", "b"]) == ["start a", "start b"]
    out = env.step(["p", "q"])
    assert out.observations == ["a:p", "b:q"]
    np.testing.assert_array_equal(out.rewards, [1.0, 1.0])
    np.testing.assert_array_equal(out.dones, [False, False])
    assert [i["count"] for i in out.infos] == [1, 1]
    assert all(i["status"] == "ok" for i in out.infos)
    # Row 1 is ended from outside; row 0 finishes its 2 steps.
    env.end_rows(np.array([False, True]))
    out = env.step(["r", None])
    assert out.observations == ["a:r", ""]
    np.testing.assert_array_equal(out.rewards, [2.0, 0.0])
    np.testing.assert_array_equal(out.dones, [True, True])
    assert out.infos[1] == {"status": "ended"}
    np.testing.assert_array_equal(env.done, [True, True])
    assert env.stats.calls == 3

  def test_limits_end_only_their_row(self):
    env = _envs(max_action_chars=10, max_observation_chars=20)
    env.reset(["a", "b", "c", "d", "e"])
    out = env.step(["raise", "y" * 11, 7, "long", "ok"])
    assert [i["status"] for i in out.infos] == [
        "error", "oversize", "wrong_type", "ok", "ok"]
    np.testing.assert_array_equal(out.rewards, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(out.dones, [True, True, True, False, False])
    assert out.observations[3] == "x" * 20  # Cut to the limit.
    stats = env.stats
    assert (stats.errors, stats.oversize, stats.wrong_type,
            stats.observations_cut, stats.calls) == (1, 1, 1, 1, 5)

  @pytest.mark.parametrize("action, match", [
      ("bad_obs", "returned a int observation for row 1"),
      ("nan", "reward nan for row 1"),
      ("bad_done", "done='yes' for row 1"),
  ])
  def test_contract_violations_name_the_row(self, action, match):
    env = _envs()
    env.reset(["a", "b"])
    with pytest.raises(errors.InputError, match=match):
      env.step(["ok", action])

  def test_bad_calls(self):
    env = _envs()
    with pytest.raises(errors.InputError, match="before reset"):
      env.step(["a"])
    env.reset(["a", "b"])
    with pytest.raises(errors.InputError, match="2 rows"):
      env.step(["a"])
    with pytest.raises(errors.InputError, match="row 1 is live"):
      env.step(["a", None])
    env.end_rows([False, True])
    with pytest.raises(errors.InputError, match="row 1 is over"):
      env.step(["a", "b"])
    with pytest.raises(errors.InputError, match="isolation"):
      _envs(isolation="thread")
    with pytest.raises(errors.InputError, match="timeout_s"):
      _envs(timeout_s=0)


class TestProcessIsolation:

  def test_hung_and_crashed_steps_end_their_rows_only(self):
    pool = verifiers.VerifierPool(num_workers=2, memory_bytes=None)
    try:
      env = _envs(isolation="process", timeout_s=0.5, pool=pool)
      env.reset(["a", "b", "c", "d"])
      out = env.step(["hang", "stuck", "crash", "p"])
      assert [i["status"] for i in out.infos] == [
          "timeout", "timeout", "crash", "ok"]
      np.testing.assert_array_equal(out.dones, [True, True, True, False])
      # Row 3's environment came back from the worker with its state.
      out = env.step([None, None, None, "q"])
      assert out.observations[3] == "d:q"
      assert out.infos[3]["count"] == 2 and out.dones[3]
      assert (env.stats.timeouts, env.stats.crashes) == (2, 1)
      # The alarm stopped "hang" in its worker; the worker stuck with the
      # alarm blocked was killed and the crashed one lost: both replaced.
      assert pool.restarts == 2
    finally:
      pool.close()
