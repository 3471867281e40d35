"""The notebook's install cell on a runtime without a checkout at hand.

The cell runs as a script in an empty working directory, as on a fresh
Colab runtime (rl_rewards itself is importable here, so nothing is
installed): it finds rl_rewards where `RL_REWARDS_SOURCE` says, and stops
with a message saying what to set when it is unset or unusable.
"""

import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _install_source():
  with open(NOTEBOOK) as f:
    notebook = nbformat.read(f, as_version=4)
  (cell,) = [c for c in notebook.cells if c.get("id") == "install"]
  return cell.source


def _run(cwd, source=None):
  env = {k: v for k, v in os.environ.items() if k != "RL_REWARDS_SOURCE"}
  if source is not None:
    env["RL_REWARDS_SOURCE"] = str(source)
  result = subprocess.run([sys.executable, "-c", _install_source()],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
  return result.returncode, result.stdout, result.stderr.strip()


def _fake_checkout(path):
  os.makedirs(path / "configs")
  (path / "configs" / "default.py").write_text("")
  (path / "setup.py").write_text("")


def test_unset_source_stops_with_what_to_set(tmp_path):
  code, _, err = _run(tmp_path)
  assert code != 0
  assert err.splitlines()[-1].startswith(
      "RuntimeError: rl_rewards is not here: set RL_REWARDS_SOURCE at the "
      "top of this cell")
  assert "git URL" in err and ".whl" in err


def test_a_checkout_directory(tmp_path):
  code, out, err = _run(tmp_path, ROOT)
  assert code == 0, err
  assert out.strip() == f"rl_rewards checkout: {ROOT}"


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz"])
def test_an_archive_is_unpacked(tmp_path, suffix):
  _fake_checkout(tmp_path / "src" / "rl_rewards-main")
  archive = tmp_path / f"rl_rewards-main{suffix}"
  if suffix == ".zip":
    with zipfile.ZipFile(archive, "w") as f:
      for name in ("configs/default.py", "setup.py"):
        f.write(tmp_path / "src" / "rl_rewards-main" / name,
                f"rl_rewards-main/{name}")
  else:
    with tarfile.open(archive, "w:gz") as f:
      f.add(tmp_path / "src" / "rl_rewards-main", "rl_rewards-main")
  runtime = tmp_path / "content"
  runtime.mkdir()
  code, out, err = _run(runtime, archive)
  assert code == 0, err
  unpacked = runtime / "rl_rewards_repo" / "rl_rewards-main"
  assert out.strip() == f"rl_rewards checkout: {unpacked}"
  assert (unpacked / "configs" / "default.py").exists()
  # Run again (the notebook rerun): the unpacked copy is found.
  assert _run(runtime, archive)[1] == out


def test_a_wheel_needs_the_configs_folder_beside_it(tmp_path):
  wheel = tmp_path / "rl_rewards-0.1.0-py3-none-any.whl"
  wheel.write_bytes(b"")
  code, _, err = _run(tmp_path, wheel)
  assert code != 0
  assert "a wheel holds the package, not the configs/ folder" in err
  _fake_checkout(tmp_path / "uploaded")
  os.rename(tmp_path / "uploaded" / "configs", tmp_path / "configs")
  code, out, err = _run(tmp_path, wheel)
  assert code == 0, err
  assert out.strip() == f"rl_rewards checkout: {tmp_path}"


def test_an_unusable_source_is_named(tmp_path):
  code, _, err = _run(tmp_path, tmp_path / "nothing_here")
  assert code != 0
  assert err.splitlines()[-1] == (
      f"RuntimeError: RL_REWARDS_SOURCE='{tmp_path / 'nothing_here'}': not a "
      "checkout directory (one with configs/default.py), an archive of one "
      "(.zip, .tar.gz), a wheel (.whl) or a git URL.")
