"""Credit-assignment methods of the RL stage: one module each.

The table `config.rl.method` chooses from is `config_methods.METHODS` (the
one list of methods, with each one's own keys); every entry names its class
here, which implements `base.Method` (its programs and extra models, its
per-step signal, advantages, extra updates and config checks), so the RL
loop has no per-method branch and a new method is one new module plus one
row of that table.
"""

import importlib

from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards.runners import verifier_refresh
from rl_rewards.runners.methods import base


def _load(impl: str):
  module, _, name = impl.partition(".")
  return getattr(importlib.import_module(f"{__name__}.{module}"), name)


# {name: the `base.Method` subclass}, in the order of the table.
METHODS = {name: _load(spec.impl)
           for name, spec in config_methods.METHODS.items()}


def make(config, verifier=None) -> base.Method:
  """The method of `config.rl.method`, for this config.

  Args:
    config: the run's config.
    verifier: the trained (or planned) `base.Verifier`; the method gets it
      when it reads step scores with `rl.prm_source="model"`.
  """
  name = config.rl.method
  if name not in METHODS:
    raise config_lib.ConfigError(
        f"config.rl.method: unknown method {name!r}; one of "
        f"{tuple(METHODS)}.")
  cls = METHODS[name]
  reads_verifier = (cls.reads_step_scores_of(config) and
                    config.rl.prm_source == "model")
  return cls(config, verifier if reads_verifier else None)


def check_config(config):
  """Checks that `config.rl` suits its method before any stage runs.

  A verifier the run trains itself (`prm` in the stages) is checked as
  planned by `config.prm`; a reused one (`prm.init_from`) when it is loaded.
  """
  cls = METHODS.get(config.rl.method)
  base.require(cls is not None, "rl.method",
               f"unknown method {config.rl.method!r}; one of "
               f"{tuple(METHODS)}.")
  base.require(not cls.reads_step_scores_of(config) or
               config.rl.prm_source != "oracle" or
               config.task.name in ("arith", "hidden_operands"),
               "rl.prm_source", "the oracle PRM needs ground-truth step "
               "labels, which only the arith and hidden_operands tasks "
               "have.")
  planned = None
  reads_verifier = (cls.reads_step_scores_of(config) and
                    config.rl.prm_source == "model")
  if reads_verifier and "prm" in config.stages.split(","):
    planned = base.Verifier.planned(config)
  make(config, planned).check()
  if verifier_refresh.enabled(config) and (planned is not None or
                                           not reads_verifier):
    verifier_refresh.check(config, planned)
