"""Config schema validation and argument parsing."""

import pytest

from rl_rewards import config_lib


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
