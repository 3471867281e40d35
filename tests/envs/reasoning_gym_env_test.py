"""A reasoning-gym dataset as a multi-turn environment (no turn labels)."""

import numpy as np

from rl_rewards.envs import batched
from rl_rewards.envs import reasoning_gym_env
from rl_rewards.tasks import reasoning_gym_tasks


def test_attempts_until_right_or_spent():
  task = reasoning_gym_tasks.ReasoningGymTask("chain_sum", size=2, seed=0)
  records = [task.record(0), task.record(1)]
  env = batched.BatchedEnv(
      lambda: reasoning_gym_env.AnswerAttemptsEnv(max_attempts=2))
  assert env.reset(records) == [r.question for r in records]
  wrong = [str(int(r.answer) + 1) for r in records]
  out = env.step([wrong[0], records[1].answer + "\n"])
  assert out.observations == [reasoning_gym_env.DEFAULT_RETRY_MESSAGE, ""]
  np.testing.assert_array_equal(out.rewards, [0.0, 1.0])
  np.testing.assert_array_equal(out.dones, [False, True])
  out = env.step([wrong[0], None])
  np.testing.assert_array_equal(out.rewards, [0.0, 0.0])
  assert out.dones[0] and out.infos[0]["attempt"] == 2
