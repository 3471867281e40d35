"""The credit-assignment methods of the RL stage: the one table, and their keys.

`METHODS` is the table `config.rl.method` chooses from. Each entry names the
class implementing the method (`rl_rewards/runners/methods/<module>.py`,
loaded by `runners.methods.make`) and the method's own keys: their defaults,
which `config_lib.base_config` puts in the section `config.rl.<name>`, and
their checks, which `config_lib.validate` runs. Keys several methods read
stay in `config.rl` (`process_coef`: grpo_process and clip_delta;
`gae_gamma`: ppo and reinforce_pp; the accuracy filter; the PPO-clip
update). A new method is one module under `runners/methods/` and one row
here.

  outcome       GRPO / Dr. GRPO / RLOO on the outcome
  reinforce_pp  REINFORCE++, ± group baseline          (rl.reinforce_pp.*)
  ppo           GAE with a learned value model         (rl.ppo.*)
  pav           outcome + α·A^μ (process advantages)   (rl.pav.*)
  pure          min-form PRM credit (softmin or hard)  (rl.pure.*)
  grpo_process  DeepSeekMath process supervision
  clip_delta    Clip/Delta refined PRM returns         (rl.clip_delta.*)
  prime         online implicit PRM                    (rl.prime.*)
  tp_grpo       thought-level rewards, adaptive weight (rl.tp_grpo.*)

Each method's module is `runners/methods/<name>.py`.

This module sits at the bottom of the package (it imports only
`ml_collections` and `errors`), so `config_lib` can build and check the
whole schema while the method modules, which build programs and import the
runners, stay above it. The checks here raise `ConfigError` naming the key.
"""

import dataclasses
from typing import Callable

import ml_collections

from rl_rewards import errors

PURE_CREDIT = ("softmin", "min", "min_paper")
PURE_BASELINES = ("token", "step")
CLIP_DELTA_MODES = ("clip", "delta", "clip_delta")
PRIME_RLOO_FORMS = ("code", "paper")
REINFORCE_BASELINES = ("none", "group")


def _no_checks(section):
  del section


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One row of `METHODS`.

  Attributes:
    impl: `module.Class` of the method under `rl_rewards/runners/methods/`.
    defaults: its own keys and their defaults (`config.rl.<name>`; empty:
      none, and no section).
    validate: checks of `config.rl.<name>`; raises ConfigError naming the
      key.
    renamed: {former key of `config.rl`: its key in the section}, so a
      config or a command line with a former key is told the new one.
  """
  impl: str
  defaults: dict = dataclasses.field(default_factory=dict)
  validate: Callable = _no_checks
  renamed: dict = dataclasses.field(default_factory=dict)


def _require(condition, key, message):
  if not condition:
    raise errors.ConfigError(f"config.rl.{key}: {message}")


# --------------------------------------------------------- reinforce_pp ---

# REINFORCE++: none (outcome - beta * KL in the token reward) | group
# (REINFORCE++-baseline); beta = reward_kl_coef (0 leaves the reference out).
_REINFORCE_PP = dict(baseline="none", reward_kl_coef=0.0)


def _validate_reinforce_pp(c):
  _require(c.baseline in REINFORCE_BASELINES, "reinforce_pp.baseline",
           f"must be one of {REINFORCE_BASELINES}, got {c.baseline!r}.")
  _require(c.baseline == "none" or c.reward_kl_coef == 0,
           "reinforce_pp.reward_kl_coef",
           "REINFORCE++-baseline puts the KL in the loss (rl.kl_coef), not "
           "in the reward; set it to 0.")


# ------------------------------------------------------------------ ppo ---

# PPO: value model (initialised from the policy backbone) + GAE; the
# discount is rl.gae_gamma (shared with reinforce_pp).
_PPO = dict(
    value_learning_rate=1e-4,  # The value model's own optimizer.
    value_clip=0.5,            # Clip range of the value regression.
    gae_lambda=1.0,
)


# ------------------------------------------------------------------ pav ---

# PAV (Setlur et al.): effective reward (r - baseline) + alpha * A^mu with
# a Best-of-K prover: Q^mu = 1 - (1 - Q)^K.
_PAV = dict(alpha=0.5, prover_k=4)


def _validate_pav(c):
  _require(c.prover_k >= 1, "pav.prover_k", f"must be >= 1, got "
           f"{c.prover_k}.")


# ----------------------------------------------------------------- pure ---

_PURE = dict(
    # PURE (Cheng et al.): min-form credit assignment: softmin (the paper's
    # transform) | min (hard: G_k = min_{j>=k} r_j) | min_paper (hard, 0
    # after the first argmin).
    credit="softmin",
    temperature=0.1,             # Softmin temperature T.
    baseline="token",            # token | step
    verifiable_reward_coef=1.0,  # 0: PRM only; > 0: PRM + VR.
    mask_step_end_tokens=True,
)


def _validate_pure(c):
  _require(c.credit in PURE_CREDIT, "pure.credit",
           f"must be one of {PURE_CREDIT}, got {c.credit!r}.")
  _require(c.baseline in PURE_BASELINES, "pure.baseline",
           f"must be one of {PURE_BASELINES}, got {c.baseline!r}.")
  _require(c.temperature > 0, "pure.temperature",
           f"must be > 0, got {c.temperature}.")


# ----------------------------------------------------------- clip_delta ---

# Clip/Delta (Gao et al.): clip threshold eta; mode clip | delta |
# clip_delta. The process term's weight is rl.process_coef.
_CLIP_DELTA = dict(eta=0.5, mode="clip_delta")


def _validate_clip_delta(c):
  _require(c.mode in CLIP_DELTA_MODES, "clip_delta.mode",
           f"must be one of {CLIP_DELTA_MODES}, got {c.mode!r}.")


# ---------------------------------------------------------------- prime ---

_PRIME = dict(
    # PRIME (Cui et al.): online implicit PRM.
    beta=0.05,
    learning_rate=1e-4,        # The implicit PRM's own optimizer.
    process_coef=5.0,
    outcome_coef=5.0,
    rloo_form="code",          # code (PRIME's runs) | paper (Eq. 5).
    batch_norm=False,          # Rescale process rewards by max |return|.
)


def _validate_prime(c):
  _require(c.rloo_form in PRIME_RLOO_FORMS, "prime.rloo_form",
           f"must be one of {PRIME_RLOO_FORMS}, got {c.rloo_form!r}.")


# -------------------------------------------------------------- tp_grpo ---

# TP-GRPO (He et al.): capability-adaptive weight r^c = alpha * acc.
_TP_GRPO = dict(alpha=1.0)


def _validate_tp_grpo(c):
  _require(c.alpha >= 0, "tp_grpo.alpha", f"must be >= 0, got {c.alpha}.")


# ---------------------------------------------------------------- table ---

METHODS = {
    "outcome": MethodSpec("outcome.Outcome"),
    "reinforce_pp": MethodSpec(
        "reinforce_pp.ReinforcePP", _REINFORCE_PP, _validate_reinforce_pp,
        {"reinforce_baseline": "baseline",
         "reward_kl_coef": "reward_kl_coef"}),
    "ppo": MethodSpec(
        "ppo.PPO", _PPO, _no_checks,
        {k: k for k in ("value_learning_rate", "value_clip", "gae_lambda")}),
    "pav": MethodSpec("pav.PAV", _PAV, _validate_pav,
                      {"pav_alpha": "alpha", "prover_k": "prover_k"}),
    "pure": MethodSpec(
        "pure.PURE", _PURE, _validate_pure,
        {"pure_credit": "credit", "pure_temperature": "temperature",
         "pure_baseline": "baseline",
         "verifiable_reward_coef": "verifiable_reward_coef",
         "mask_step_end_tokens": "mask_step_end_tokens"}),
    "grpo_process": MethodSpec("grpo_process.GRPOProcess"),
    "clip_delta": MethodSpec(
        "clip_delta.ClipDelta", _CLIP_DELTA, _validate_clip_delta,
        {"clip_eta": "eta", "clip_delta_mode": "mode"}),
    "prime": MethodSpec(
        "prime.PRIME", _PRIME, _validate_prime,
        {f"prime_{k}": k for k in _PRIME}),
    "tp_grpo": MethodSpec("tp_grpo.TPGRPO", _TP_GRPO, _validate_tp_grpo,
                          {"tp_alpha": "alpha"}),
}


def sections() -> dict:
  """{method: ConfigDict of its defaults} for every method with keys."""
  return {name: ml_collections.ConfigDict(dict(spec.defaults))
          for name, spec in METHODS.items() if spec.defaults}


def validate(rl):
  """Checks every method's section of `config.rl` (ConfigError naming the
  key)."""
  for name, spec in METHODS.items():
    if spec.defaults:
      spec.validate(rl[name])


def renamed_keys() -> dict:
  """{"rl.<former key>": "rl.<method>.<key>"}: where each former key of
  `config.rl` went."""
  return {f"rl.{old}": f"rl.{name}.{new}"
          for name, spec in METHODS.items()
          for old, new in spec.renamed.items()}


def upgrade_saved(config_dict: dict) -> dict:
  """A saved config (a workdir's `config.json`) with the former keys of
  `config.rl` moved to their method's section, so that runs written before
  the move still resume and load. Returns a new dict; others are unchanged.
  """
  rl = config_dict.get("rl")
  if not isinstance(rl, dict):
    return config_dict
  rl = dict(rl)
  for name, spec in METHODS.items():
    for old, new in spec.renamed.items():
      if old in rl:
        section = dict(rl.get(name) or {})
        section.setdefault(new, rl.pop(old))
        rl[name] = section
  return dict(config_dict, rl=rl)
