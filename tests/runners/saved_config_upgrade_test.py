"""Workdirs written before the methods' keys moved to `config.rl.<method>`
still resume and load: their `config.json` is read with the former keys in
their new places."""

import json
import os

import pytest

from rl_rewards import config_lib
from rl_rewards import config_methods
from rl_rewards import metrics as metrics_lib
from rl_rewards.runners import pipeline
from rl_rewards.runners import prm_stages


def _former_layout(config) -> dict:
  """`config` as a run written before the move saved it."""
  saved = json.loads(config.to_json_best_effort())
  for dotted_old, dotted_new in config_methods.renamed_keys().items():
    _, name, key = dotted_new.split(".")
    saved["rl"][dotted_old.split(".")[1]] = saved["rl"][name].pop(key)
  for name in config_methods.sections():
    # Keys without a former name were added since: a former run lacks them
    # (they load at their defaults).
    del saved["rl"][name]
  return saved


def _write(workdir, saved):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, metrics_lib.CONFIG_FILE), "w") as f:
    json.dump(saved, f)


def test_a_former_config_resumes_and_loads_with_its_values(tmp_path):
  config = config_lib.base_config()
  config.rl.pav.alpha = 0.7
  config.rl.prime.beta = 0.02
  saved = _former_layout(config)
  assert saved["rl"]["pav_alpha"] == 0.7 and "pav" not in saved["rl"]
  _write(tmp_path, saved)
  # Same config: resuming is allowed (and config.json is rewritten).
  pipeline._check_config_file(config, str(tmp_path))
  assert metrics_lib.read_json(os.path.join(
      tmp_path, metrics_lib.CONFIG_FILE))["rl"]["pav"]["alpha"] == 0.7
  _write(tmp_path, saved)
  loaded = prm_stages.run_config(str(tmp_path))
  assert loaded.rl.pav.alpha == 0.7 and loaded.rl.prime.beta == 0.02
  assert loaded.rl.pure.credit == config.rl.pure.credit


def test_a_former_config_with_another_value_is_a_different_run(tmp_path):
  config = config_lib.base_config()
  saved = _former_layout(config)
  saved["rl"]["pav_alpha"] = config.rl.pav.alpha + 0.25
  _write(tmp_path, saved)
  with pytest.raises(config_lib.ConfigError, match=r"rl\.pav\.alpha"):
    pipeline._check_config_file(config, str(tmp_path))


def test_upgrade_leaves_current_configs_alone():
  saved = json.loads(config_lib.base_config().to_json_best_effort())
  assert config_methods.upgrade_saved(saved) == saved
