"""Credit-assignment methods of the RL stage: one module each.

`METHODS` is the explicit table `config.rl.method` chooses from; every entry
implements `base.Method` (its extra models, per-step signal, advantages,
extra updates and config checks), so the RL loop has no per-method branch
and a new method is one new module plus one row here.

  outcome       GRPO / Dr. GRPO / RLOO on the outcome   outcome.py
  reinforce_pp  REINFORCE++, ± group baseline           reinforce_pp.py
  ppo           GAE with a learned value model          ppo.py
  pav           outcome + α·A^μ (process advantages)    pav.py
  pure          min-form PRM credit (softmin or hard)   pure.py
  grpo_process  DeepSeekMath process supervision        grpo_process.py
  clip_delta    Clip/Delta refined PRM returns          clip_delta.py
  prime         online implicit PRM                     prime.py
  tp_grpo       thought-level rewards, adaptive weight  tp_grpo.py
"""

from rl_rewards import config_lib
from rl_rewards.runners import verifier_refresh
from rl_rewards.runners.methods import base
from rl_rewards.runners.methods import clip_delta
from rl_rewards.runners.methods import grpo_process
from rl_rewards.runners.methods import outcome
from rl_rewards.runners.methods import pav
from rl_rewards.runners.methods import ppo
from rl_rewards.runners.methods import prime
from rl_rewards.runners.methods import pure
from rl_rewards.runners.methods import reinforce_pp
from rl_rewards.runners.methods import tp_grpo

METHODS = {
    "outcome": outcome.Outcome,
    "reinforce_pp": reinforce_pp.ReinforcePP,
    "ppo": ppo.PPO,
    "pav": pav.PAV,
    "pure": pure.PURE,
    "grpo_process": grpo_process.GRPOProcess,
    "clip_delta": clip_delta.ClipDelta,
    "prime": prime.PRIME,
    "tp_grpo": tp_grpo.TPGRPO,
}


def make(config) -> base.Method:
  """The method of `config.rl.method`, for this config."""
  name = config.rl.method
  if name not in METHODS:
    raise config_lib.ConfigError(
        f"config.rl.method: unknown method {name!r}; one of "
        f"{tuple(METHODS)}.")
  return METHODS[name](config)


def check_config(config):
  """Checks that `config.rl` suits its method before any stage runs.

  A verifier the run trains itself (`prm` in the stages) is checked as
  planned by `config.prm`; a reused one (`prm.init_from`) when it is loaded.
  """
  method = make(config)
  base.require(not method.reads_step_scores or
               config.rl.prm_source != "oracle" or config.task.name == "arith",
               "rl.prm_source", "the oracle PRM needs ground-truth step "
               "labels, which only the arith task has.")
  planned = None
  reads_verifier = (method.reads_step_scores and
                    config.rl.prm_source == "model")
  if reads_verifier and "prm" in config.stages.split(","):
    planned = base.Verifier.planned(config)
  method.check(planned)
  if verifier_refresh.enabled(config) and (planned is not None or
                                           not reads_verifier):
    verifier_refresh.check(config, planned)
