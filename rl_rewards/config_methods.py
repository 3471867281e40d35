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
  prof          PRM-consistency filter, GRPO on kept   (rl.prof.*)
  posterior_grpo  outcome + thinking reward if correct (rl.posterior_grpo.*)
  trust_grpo    outcome + trust-weighted thinking      (rl.trust_grpo.*)
  fapo          flawed-positive penalty, then GRPO     (rl.fapo.*)
  capo          token penalty on critic-marked steps   (rl.capo.*)
  mrt           outcome + α·progress per episode       (rl.mrt.*)
  igpo          information-gain turn rewards          (rl.igpo.*)
  spa_rl        online progress estimator, Σ c_k ≈ R   (rl.spa_rl.*)

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
PPO_REWARDS = ("outcome", "prm")


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
    # Token rewards: outcome (the outcome on the last token) | prm (each
    # step's score on its last token + the outcome on the last token,
    # Math-Shepherd's step-by-step PPO; reads the step scores).
    reward="outcome",
    step_reward_coef=1.0,      # c_s: r_k = c_s * p_k at step k's end.
)


def _validate_ppo(c):
  _require(c.reward in PPO_REWARDS, "ppo.reward",
           f"must be one of {PPO_REWARDS}, got {c.reward!r}.")


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


# ----------------------------------------------------------------- prof ---

# PROF (Ye et al.): per group, drop the num_remove responses whose step
# scores agree least with their outcome (consistency score minus a length
# penalty for fewer than min_steps or more than max_steps scored steps),
# balancing correct and incorrect; GRPO over the kept rows.
_PROF = dict(num_remove=4, min_steps=2, max_steps=30, length_penalty=10.0)


def _validate_prof(c):
  _require(c.num_remove >= 0, "prof.num_remove",
           f"must be >= 0, got {c.num_remove}.")
  _require(0 <= c.min_steps <= c.max_steps, "prof.min_steps",
           f"must be in [0, prof.max_steps={c.max_steps}], got "
           f"{c.min_steps}.")
  _require(c.length_penalty >= 0, "prof.length_penalty",
           f"must be >= 0, got {c.length_penalty}.")


# ------------------------------------------------------- posterior_grpo ---

# Posterior-GRPO (Fan et al.): R = outcome + 1[outcome > correct_threshold]
# * thinking_coef * (mean step score); GRPO on R.
_POSTERIOR_GRPO = dict(thinking_coef=1.0, correct_threshold=0.5)


def _validate_posterior_grpo(c):
  _require(c.thinking_coef >= 0, "posterior_grpo.thinking_coef",
           f"must be >= 0, got {c.thinking_coef}.")


# ----------------------------------------------------------- trust_grpo ---

# Trust-GRPO (SophiaVL-R1): r = r_ans + w * r_think, w = base_weight *
# exp(-step / anneal_steps) * trust of the group (the reference code's
# thresholds).
_TRUST_GRPO = dict(base_weight=0.3, anneal_steps=500.0, correct_threshold=0.5,
                   judge_threshold=0.2, solved_threshold=0.9,
                   failed_threshold=0.1)


def _validate_trust_grpo(c):
  _require(c.base_weight >= 0, "trust_grpo.base_weight",
           f"must be >= 0, got {c.base_weight}.")
  _require(c.anneal_steps > 0, "trust_grpo.anneal_steps",
           f"must be > 0, got {c.anneal_steps}.")


# ----------------------------------------------------------------- fapo ---

# FAPO (Ding et al.): a correct response the critic flags (some step scored
# below threshold) loses penalty from its +1 / -1 reward; then GRPO.
_FAPO = dict(penalty=1.0, threshold=0.5)


def _validate_fapo(c):
  _require(c.penalty >= 0, "fapo.penalty", f"must be >= 0, got {c.penalty}.")
  _require(0 < c.threshold <= 1, "fapo.threshold",
           f"must be in (0, 1], got {c.threshold}.")


# ----------------------------------------------------------------- capo ---

# CAPO (Xie et al.): token reward w_whole * outcome - w_process on the
# tokens of steps the critiques mark wrong: one greedy critique (a score
# below threshold), or `critiques` sampled ones combined by `voting`.
_CAPO = dict(w_whole=2.0, w_process=1.0, threshold=0.5, critiques=1,
             voting="majority")
CAPO_VOTING = ("majority", "intersection", "average")  # core.critiques'.


def _validate_capo(c):
  _require(0 <= c.w_process < c.w_whole, "capo.w_process",
           f"must be in [0, w_whole={c.w_whole}) (a correct response with "
           f"a wrong step stays above an incorrect one), got {c.w_process}.")
  _require(0 < c.threshold <= 1, "capo.threshold",
           f"must be in (0, 1], got {c.threshold}.")
  _require(isinstance(c.critiques, int) and c.critiques >= 1,
           "capo.critiques", f"must be an integer >= 1, got {c.critiques!r}.")
  _require(c.voting in CAPO_VOTING, "capo.voting",
           f"must be one of {CAPO_VOTING}, got {c.voting!r}.")


# ------------------------------------------------------------------ mrt ---

# MRT (Qu et al.): outcome advantage + alpha * progress of the success after
# each step; reference previous (J_j - J_{j-1}) | prompt (J_j - J(question)).
# j: where J comes from, the loop's step scores (Q of each step prefix) or
# the forced answer's exact probability after each prefix (answer probe).
_MRT = dict(alpha=0.5, reference="previous", j="scores")
MRT_REFERENCES = ("previous", "prompt")
MRT_J = ("scores", "forced")


def _validate_mrt(c):
  _require(c.reference in MRT_REFERENCES, "mrt.reference",
           f"must be one of {MRT_REFERENCES}, got {c.reference!r}.")
  _require(c.j in MRT_J, "mrt.j", f"must be one of {MRT_J}, got {c.j!r}.")
  _require(c.alpha >= 0, "mrt.alpha", f"must be >= 0, got {c.alpha}.")


# ------------------------------------------------------------------ gra ---

# G-RA (Sun et al.): turn rewards turn_reward * step score accumulated into
# the return only when the outcome reward is >= threshold.
_GRA = dict(threshold=1.0, turn_reward=0.1)


def _validate_gra(c):
  _require(c.turn_reward >= 0, "gra.turn_reward",
           f"must be >= 0, got {c.turn_reward}.")


# --------------------------------------------------------------- spa_rl ---

# SPA-RL (Wang et al.): an online progress estimator (its own optimizer,
# learning_rate) whose per-turn contributions sum to the outcome; turn reward
# contribution_coef * c_k + grounding_coef * g_k, plus outcome_coef * R in
# every return.
_SPA_RL = dict(learning_rate=1e-4, contribution_coef=1.0, grounding_coef=0.5,
               outcome_coef=0.0)


def _validate_spa_rl(c):
  _require(c.learning_rate > 0, "spa_rl.learning_rate",
           f"must be > 0, got {c.learning_rate}.")
  for key in ("contribution_coef", "grounding_coef", "outcome_coef"):
    _require(c[key] >= 0, f"spa_rl.{key}", f"must be >= 0, got {c[key]}.")


# ----------------------------------------------------------------- igpo ---

# IGPO (Wang et al.): turn reward = gain of P(true answer), the outcome on
# the answer turn; group z-score (norm: joint | separate), then discounted
# sums over turns with gamma (the released code's 1.0).
_IGPO = dict(gamma=1.0, norm="joint")
IGPO_NORMS = ("joint", "separate")  # core.igpo's.


def _validate_igpo(c):
  _require(0 <= c.gamma <= 1, "igpo.gamma",
           f"must be in [0, 1], got {c.gamma}.")
  _require(c.norm in IGPO_NORMS, "igpo.norm",
           f"must be one of {IGPO_NORMS}, got {c.norm!r}.")


# ---------------------------------------------------------------- table ---

METHODS = {
    "outcome": MethodSpec("outcome.Outcome"),
    "reinforce_pp": MethodSpec(
        "reinforce_pp.ReinforcePP", _REINFORCE_PP, _validate_reinforce_pp,
        {"reinforce_baseline": "baseline",
         "reward_kl_coef": "reward_kl_coef"}),
    "ppo": MethodSpec(
        "ppo.PPO", _PPO, _validate_ppo,
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
    "prof": MethodSpec("prof.PROF", _PROF, _validate_prof),
    "posterior_grpo": MethodSpec("posterior_grpo.PosteriorGRPO",
                                 _POSTERIOR_GRPO, _validate_posterior_grpo),
    "trust_grpo": MethodSpec("trust_grpo.TrustGRPO", _TRUST_GRPO,
                             _validate_trust_grpo),
    "fapo": MethodSpec("fapo.FAPO", _FAPO, _validate_fapo),
    "capo": MethodSpec("capo.CAPO", _CAPO, _validate_capo),
    "mrt": MethodSpec("mrt.MRT", _MRT, _validate_mrt),
    "gra": MethodSpec("gra.GRA", _GRA, _validate_gra),
    "igpo": MethodSpec("igpo.IGPO", _IGPO, _validate_igpo),
    "spa_rl": MethodSpec("spa_rl.SPARL", _SPA_RL, _validate_spa_rl),
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
