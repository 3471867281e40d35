"""Small environments for the BatchedEnv tests (importable by pool workers)."""

import os
import signal
import time


class CountingEnv:
  """Counts its steps; done after `length` steps, reward = step number.

  Special actions: "raise" raises, "hang" sleeps, "stuck" sleeps with the
  pool's alarm blocked (like C code that never returns to Python), "crash"
  kills the process,
  "bad_obs" / "nan" / "bad_done" break the step's contract, "long" returns
  a 50-character observation.
  """

  def __init__(self, length=3):
    self.length = length
    self.count = 0
    self.problem = None

  def reset(self, problem):
    self.problem = problem
    self.count = 0
    return f"start {problem}"

  def step(self, action):
    if action == "raise":
      raise RuntimeError("parser bug")
    if action == "hang":
      time.sleep(60)
    if action == "stuck":
      signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
      time.sleep(60)
    if action == "crash":
      os._exit(3)  # pylint: disable=protected-access
    if action == "bad_obs":
      return 5, 0.0, False, {}
    if action == "nan":
      return "", float("nan"), False, {}
    if action == "bad_done":
      return "", 0.0, "yes", {}
    self.count += 1
    observation = "x" * 50 if action == "long" else f"{self.problem}:{action}"
    return observation, float(self.count), self.count >= self.length, {
        "count": self.count}
