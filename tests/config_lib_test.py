"""Config schema validation and argument parsing."""

import pytest

from rl_rewards import cli
from rl_rewards import config_data
from rl_rewards import config_lib
from rl_rewards import config_presets
from rl_rewards.data import readers
from rl_rewards.runners import methods


def _config():
  return config_lib.base_config()


def test_base_config_is_valid():
  config_lib.validate(_config())


@pytest.mark.parametrize("key,value,message", [
    ("rl.group_size", 0, "rl.group_size"),
    ("rl.group_size", -3, "positive"),
    ("rl.prompts_per_step", 0, "rl.prompts_per_step"),
    ("sft.batch_size", 0, "sft.batch_size"),
    ("rl.top_p", 0.0, "rl.top_p"),
    ("rl.clip_c", 0.5, "dual-clip"),
    ("rl.advantage_estimator", "ppo", "rl.advantage_estimator"),
    ("rl.loss_agg_mode", "mean", "rl.loss_agg_mode"),
    ("stages", "sft,nope", "unknown stage"),
    ("task.min_ops", 9, "task.min_ops"),
    ("logging.wandb_mode", "cloud", "logging.wandb_mode"),
    ("logging.wandb_entity", "me", "logging.wandb_project is not"),
    ("logging.wandb_project", "a/b", "logging.wandb_project"),
    ("logging.progress", "fancy", "logging.progress"),
    ("logging.progress_every_s", 0.0, "logging.progress_every_s"),
])
def test_bad_values_name_the_key(key, value, message):
  config = _config()
  section, _, name = key.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(config)


def test_rloo_needs_two_samples():
  config = _config()
  config.rl.advantage_estimator = "rloo"
  config.rl.group_size = 1
  with pytest.raises(config_lib.ConfigError, match="RLOO"):
    config_lib.validate(config)


def test_unknown_key_is_rejected():
  config = _config()
  config.rl.unlock()
  config.rl.grop_size = 4
  with pytest.raises(config_lib.ConfigError, match="rl.grop_size: unknown"):
    config_lib.validate(config)


def test_wrong_type_is_rejected():
  config = _config()
  config.rl.unlock()
  del config.rl["group_size"]
  config.rl.group_size = "eight"
  with pytest.raises(config_lib.ConfigError, match="rl.group_size: must be an int"):
    config_lib.validate(config)


def test_minibatches_must_divide_rollout_batch():
  config = _config()
  config.rl.minibatches = 3
  with pytest.raises(config_lib.ConfigError, match="minibatches"):
    config_lib.validate(config)


def test_parse_arg_types_and_flags():
  arg = config_lib.parse_arg("size=test,runlocal,steps=7",
                             size="tiny", runlocal=False, steps=1)
  assert arg.size == "test" and arg.runlocal is True and arg.steps == 7
  with pytest.raises(config_lib.ConfigError, match="Unknown config argument"):
    config_lib.parse_arg("sise=test", size="tiny")


@pytest.mark.parametrize("key,value,message", [
    # Default batches: sft 64, rl 32 x 8 = 256 rows in 1 minibatch, prm 64.
    ("sft.micro_batch_size", -1, "sft.micro_batch_size: must be >= 0"),
    ("sft.micro_batch_size", 24, "sft.micro_batch_size: must divide "
                                 "sft.batch_size"),
    ("rl.micro_batch_size", 48, "rl.micro_batch_size: must divide the "
                                "minibatch"),
    ("rl.pass_micro_batch_size", 96, "rl.pass_micro_batch_size: must divide"),
    ("rl.pass_micro_batch_size", -4, "rl.pass_micro_batch_size: must be"),
    ("prm.micro_batch_size", 24, "prm.micro_batch_size: must divide"),
    ("prm.pass_micro_batch_size", -1, "prm.pass_micro_batch_size"),
    ("model.logits_chunk", 0, "model.logits_chunk"),
])
def test_bad_micro_batch_sizes_name_the_key(key, value, message):
  config = _config()
  section, _, name = key.rpartition(".")
  config[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(config)


def test_micro_batches_that_divide_are_valid():
  config = _config()
  config.sft.micro_batch_size = 16
  config.rl.minibatches = 4                # 64-row minibatches
  config.rl.micro_batch_size = 16
  config.rl.pass_micro_batch_size = 128
  config.prm.micro_batch_size = 8
  config.model.logits_chunk = 7
  config_lib.validate(config)
  assert config_lib.pass_micro_batch_size(config.rl) == 128
  config.rl.pass_micro_batch_size = 0      # Passes follow the updates.
  assert config_lib.pass_micro_batch_size(config.rl) == 16
  # The minibatch, not the rollout, bounds the update's micro-batches.
  config.rl.micro_batch_size = 128
  with pytest.raises(config_lib.ConfigError, match="rl.micro_batch_size"):
    config_lib.validate(config)


def test_group_losses_need_whole_groups_per_micro_batch():
  config = _config()
  config.rl.method = "prime"
  config.rl.micro_batch_size = 4           # group_size 8
  # The method checks what suits it (runners/methods/prime.py).
  with pytest.raises(config_lib.ConfigError, match="multiple of group_size"):
    methods.check_config(config_lib.validate(config))
  config.rl.micro_batch_size = 16
  methods.check_config(config_lib.validate(config))
  config.prm.model = "implicit"
  config.prm.micro_batch_size = 2          # samples_per_problem 4
  with pytest.raises(config_lib.ConfigError,
                     match="prm.micro_batch_size: must be a multiple of "
                           "labels.samples_per_problem"):
    config_lib.validate(config)


def test_logging_section_defaults():
  logging = _config().logging
  assert logging.tensorboard is True
  assert logging.wandb_project == "" and logging.wandb_mode == "online"
  assert logging.progress == "auto"


def test_regimes_set_the_task_and_keep_samples_per_step():
  standard = config_presets.apply_size(config_lib.base_config(), "tiny")
  assert (standard.task.min_ops, standard.task.max_ops) == (2, 6)
  long = config_presets.apply_size(config_lib.base_config(), "tiny",
                                   regime="long_sparse")
  assert (long.task.min_ops, long.task.max_ops) == (4, 9)
  assert long.sft.target_accuracy == 0.20
  assert long.sft.max_steps == 1500
  n4 = config_presets.apply_size(config_lib.base_config(), "tiny",
                                 regime="long_sparse_n4")
  assert (n4.rl.group_size, n4.rl.prompts_per_step) == (4, 64)
  assert (n4.rl.group_size * n4.rl.prompts_per_step ==
          long.rl.group_size * long.rl.prompts_per_step)
  weak = config_presets.apply_size(config_lib.base_config(), "tiny",
                                   regime="long_weak")
  assert (weak.task.min_ops, weak.task.max_ops) == (4, 9)
  assert weak.sft.target_accuracy == 0.10 and weak.sft.gate_every_steps == 10
  assert long.sft.gate_every_steps == 50
  assert (weak.rl.group_size, weak.rl.prompts_per_step) == (
      long.rl.group_size, long.rl.prompts_per_step)
  for config in (standard, long, n4, weak):
    config_lib.validate(config)
  # The test size keeps its few SFT steps.
  test = config_presets.apply_size(config_lib.base_config(), "test",
                                   regime="long_sparse")
  assert test.sft.max_steps == 4 and test.task.max_ops == 9


def test_cpu_sizes_batch_their_programs_for_a_cpu():
  """tiny and small: 8-row micro-batches, and the SFT gate's 200 problems
  in one 256-row greedy batch (not padded to 512); test keeps its own."""
  for size in ("tiny", "small"):
    config = config_presets.apply_size(config_lib.base_config(), size)
    assert (config.sft.micro_batch_size, config.rl.micro_batch_size,
            config.prm.micro_batch_size) == (8, 8, 8)
    assert config.eval.batch_size == 256
    assert config.eval.batch_size >= config.sft.gate_eval_size
    config_lib.validate(config)
  test = config_presets.apply_size(config_lib.base_config(), "test")
  assert test.eval.batch_size == 32 and test.sft.micro_batch_size == 0


def test_unknown_regime_names_the_choices():
  with pytest.raises(config_lib.ConfigError, match="long_sparse_n4"):
    config_presets.apply_size(config_lib.base_config(), "tiny", regime="hard")


def test_the_longest_regime_problem_fits_its_prompt_and_response():
  from rl_rewards.runners import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  config = config_presets.apply_size(config_lib.base_config(), "tiny",
                                     regime="long_sparse")
  task = tasks_lib.make_task(config.task, config.seed)
  problems = task.problems("train", 0, 200)
  longest = max(problems, key=lambda p: p.num_ops)
  assert longest.num_ops == 9
  prompts, _ = task.encode_prompts([longest])
  assert prompts.shape[1] == config.task.max_prompt_len
  # Raises when the reference solution and EOS do not fit the response.
  task.encode_sft([longest])
  (solution,) = task.references([longest])
  assert len(solution) + 1 <= config.task.max_new_tokens  # + EOS.


# ------------------------------------------------------ text data and sets --


def _text_config(**values):
  config = _config()
  config.task.name = "math"
  config.stages = "rl"
  for key, value in values.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def test_eval_sets_parse_names_presets_and_paths():
  config = _text_config(**{
      "task.preset": "deepscaler",
      "eval.sets": " math500:/d/m.jsonl, aime24:/d/aime.parquet,"
                   "hard:AIME:/d/h.json, own:/d/o:1.parquet"})
  sets = config_data.eval_sets(config_lib.validate(config))
  assert [(s.name, s.path) for s in sets] == [
      ("math500", "/d/m.jsonl"), ("aime24", "/d/aime.parquet"),
      ("hard", "/d/h.json"), ("own", "/d/o:1.parquet")]
  presets = readers.PRESETS
  # A preset by NAME, by alias, explicitly, and else the task's layout.
  assert [s.fields for s in sets] == [
      presets["math500"], presets["aime"], presets["aime"],
      presets["deepscaler"]]
  assert config_data.eval_sets(_text_config()) == []


@pytest.mark.parametrize("sets, message", [
    ("math500", r"bad entry 'math500'; expected NAME:PATH"),
    ("math500:", r"bad entry 'math500:'; expected NAME:PATH"),
    ("math-500:/d/m.jsonl", r"bad entry 'math-500:/d/m.jsonl'; NAME must "
     r"match \[A-Za-z0-9_\]\+"),
    (":/d/m.jsonl", r"bad entry ':/d/m.jsonl'; NAME must match"),
    ("m:/x.jsonl", None),
    ("a:/x.jsonl,a:/y.jsonl", r"bad entry 'a:/y.jsonl'; the name 'a' is "
     "used twice"),
    ("a:math500:", r"bad entry 'a:math500:'; the path is empty"),
])
def test_bad_eval_sets_name_the_key_and_entry(sets, message):
  if message is None:  # The good entry of the cases around it.
    config_lib.validate(_text_config(**{"eval.sets": sets}))
    return
  with pytest.raises(config_lib.ConfigError,
                     match=r"config\.eval\.sets: " + message):
    config_lib.validate(_text_config(**{"eval.sets": sets}))


def test_eval_sets_of_the_task_layout_report_a_bad_layout():
  with pytest.raises(config_lib.ConfigError, match=r"config\.eval\.sets: bad "
                     r"entry 'x:/d'; it takes the task's layout, which is bad:"
                     r" config\.task\.preset: unknown preset 'nope'"):
    config_data.eval_sets(_text_config(**{"eval.sets": "x:/d",
                                         "task.preset": "nope"}))


@pytest.mark.parametrize("values, message", [
    ({"task.preset": "gsm9k"}, r"config\.task\.preset: unknown preset"),
    ({"task.fields": "question"}, r"config\.task\.fields: bad entry"),
    ({"task.fields": "answer_from=field"},
     r"config\.task\.fields: answer: answer_from=field needs the path"),
    ({"task.name": "arith", "task.preset": "math"},
     r"config\.task\.preset: only for file tasks"),
    ({"task.name": "arith", "eval.sets": "m:/x.jsonl"},
     r"config\.eval\.sets: held-out sets are for text tasks"),
    ({"task.name": "reasoning_gym", "task.dataset": "chain_sum",
      "eval.sets": "m:/x.jsonl"}, r"config\.eval\.sets: bad entry "
     r"'m:/x\.jsonl'; the reasoning_gym task reads no files: name the layout"
     r" \(NAME:PRESET:PATH\)"),
    ({"eval.sets_samples": 4, "eval.pass_n": 8},
     r"config\.eval\.sets_samples: must be >= eval\.pass_n \(8\)"),
    ({"eval.sets_samples": -1}, r"config\.eval\.sets_samples: must be >= 0"),
    ({"eval.sets_size": -1}, r"config\.eval\.sets_size"),
    ({"eval.sets_temperature": 0.0}, r"config\.eval\.sets_temperature"),
])
def test_bad_text_data_keys(values, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(_text_config(**values))


def test_sft_needs_a_layout_with_solutions():
  config = _text_config(**{"task.preset": "aime"})
  config_lib.validate(config)  # RL and evaluation need no solution.
  for stages in ("sft,rl", "rl,sft_continue"):
    config.stages = stages
    with pytest.raises(config_lib.ConfigError, match=r"config\.task\.fields: "
                       r"the sft(_continue)? stage trains on reference "
                       r"solutions, but the layout \(task\.preset='aime'"):
      config_lib.validate(config)
  config.stages = "sft,rl"
  config.sft.init_from = "/runs/finished_sft"  # No SFT training here.
  config_lib.validate(config)
  config.sft.init_from = ""
  config.task.fields = "solution=Solution"
  config_lib.validate(config)


def test_each_method_has_its_own_section_and_checks():
  config = config_lib.base_config()
  assert config.rl.pav.alpha == 0.5 and config.rl.prime.beta == 0.05
  assert "pav_alpha" not in config.rl and "outcome" not in config.rl
  for key, value, message in (
      ("pure.credit", "max", r"rl\.pure\.credit"),
      ("clip_delta.mode", "x", r"rl\.clip_delta\.mode"),
      ("tp_grpo.alpha", -1.0, r"rl\.tp_grpo\.alpha")):
    bad = config_lib.base_config()
    section, _, name = key.partition(".")
    bad.rl[section][name] = value
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.validate(bad)


def test_a_former_key_names_its_new_place():
  config = config_lib.base_config()
  config.rl.prime_beta = 0.1  # A config file written before the sections.
  with pytest.raises(config_lib.ConfigError, match=(
      r"rl\.prime_beta.*moved to config\.rl\.prime\.beta")):
    config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError, match=(
      r"--config\.rl\.pav_alpha.*--config\.rl\.pav\.alpha")):
    cli.check_override_key(config_lib.base_config(), "rl.pav_alpha")
