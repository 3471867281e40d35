"""The directory names of sweep points: short, readable, unique, stable."""

import json
import os

import pytest

from rl_rewards import cli
from rl_rewards import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_names_are_the_index_and_the_values_that_vary():
  points = [{"rl.pav.alpha": a, "rl.pav.prover_k": k, "rl.steps": 50}
            for a in (0.25, 1.0) for k in (1, 4)]
  assert cli.point_dirs(points) == [
      "0-alpha=0.25,prover_k=1", "1-alpha=0.25,prover_k=4",
      "2-alpha=1,prover_k=1", "3-alpha=1,prover_k=4"]
  # Ten points or more: the index is padded, so the names sort in order.
  names = cli.point_dirs([{"rl.learning_rate": 1e-5 * i} for i in range(11)])
  assert names[0] == "00-learning_rate=0" and names[10].startswith("10-")
  assert names == sorted(names)


def test_one_point_shows_its_values_and_none_is_its_index():
  assert cli.point_dirs([{"sft.init_from": "runs/a b/sft", "rl.use_kl": True}]
                        ) == ["0-use_kl=true,init_from=runs-a-b-sft"]
  assert cli.point_dirs([{}]) == ["0"]


def test_keys_ending_alike_keep_their_path_and_long_names_are_cut():
  points = [{"sft.learning_rate": 1e-4, "rl.learning_rate": 1e-5},
            {"sft.learning_rate": 2e-4, "rl.learning_rate": 1e-5},
            {"sft.learning_rate": 2e-4, "rl.learning_rate": 3e-5}]
  assert cli.point_dirs(points) == [
      "0-rl.learning_rate=1e-05,sft.learning_rate=0.0001",
      "1-rl.learning_rate=1e-05,sft.learning_rate=0.0002",
      "2-rl.learning_rate=3e-05,sft.learning_rate=0.0002"]
  # Too long with whole keys: keys of several words go by their initials.
  points = [{"prm.drop_after_first_negative": d, "prm.label_problems": n,
             "prm.model": "generative"} for d in (False, True)
            for n in (128, 1024)]
  assert cli.point_dirs(points) == [
      "0-dafn=false,lp=128", "1-dafn=false,lp=1024", "2-dafn=true,lp=128",
      "3-dafn=true,lp=1024"]
  # Values are cut to 16 characters and the name's values part to 48: the
  # index keeps points apart that differ only past the cut.
  long = [{"task.system_prompt": "x" * 30 + c, "task.delimiter": "y" * 20 + c,
           "task.fields": "z" * 20 + c} for c in "ab"]
  names = cli.point_dirs(long)
  assert names[0] == "0-delimiter=" + "y" * 16 + ",fields=" + "z" * 14 + "~"
  assert names[1] == "1" + names[0][1:]


def test_every_grid_of_the_configs_gets_short_unique_names():
  for spec in ("pav.py", "grpo.py", "prm.py:sweep=budget"):
    points = cli.load_sweep(os.path.join(ROOT, "configs", spec))
    names = cli.point_dirs(points)
    assert len(set(names)) == len(points), spec
    assert max(map(len, names)) <= 52, names
    # The same grid on a rerun: the same names (resume finds its points).
    assert cli.point_dirs(cli.load_sweep(
        os.path.join(ROOT, "configs", spec))) == names


def test_the_point_file_holds_the_point_and_refuses_another(tmp_path):
  workdir = str(tmp_path / "0-learning_rate=0.0001")
  cli.write_point_file(workdir, "configs/grpo.py", {"rl.learning_rate": 1e-4})
  with open(os.path.join(workdir, cli.POINT_FILE)) as f:
    record = json.load(f)
  assert record == {"config": "configs/grpo.py",
                    "overrides": {"rl.learning_rate": 1e-4},
                    "name": "rl.learning_rate=0.0001"}
  # The same point again (a resumed sweep): accepted.
  cli.write_point_file(workdir, "configs/grpo.py", {"rl.learning_rate": 1e-4})
  with pytest.raises(config_lib.ConfigError,
                     match="holds the point 'rl.learning_rate=0.0001' of an "
                     "earlier grid"):
    cli.write_point_file(workdir, "configs/grpo.py",
                         {"rl.learning_rate": 5e-5})
