"""How `.ci/run` picks the Python of its second run (`newest_python`).

Stub interpreters in a fake pyenv root answer the version probe the way a real
CPython does; the function must name the newest one that is >= 3.12 and
starts, and nothing (exit status 1) when there is none.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI_RUN = os.path.join(ROOT, ".ci", "run")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None,
                                reason="needs bash")


def _stub(path, version):
  """An executable that answers the probe as CPython `version` would.

  The probe prints major * 10000 + minor * 100 + micro for Python >= 3.12 and
  `None` below; `version=None` stands for an interpreter that fails to start.
  """
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if version is None:
    body = "exit 1\n"
  else:
    major, minor, micro = version
    code = (f"{major * 10000 + minor * 100 + micro}"
            if (major, minor) >= (3, 12) else "None")
    body = f'[ "$1" = "--version" ] && exit 0\necho {code}\n'
  with open(path, "w") as f:
    f.write("#!/bin/sh\n" + body)
  os.chmod(path, 0o755)


def _newest(tmp_path, versions, on_path=()):
  """Runs `newest_python` with pyenv versions `versions` (name -> version).

  `on_path` names (e.g. `python3.12`) get stubs in a directory that is the
  whole PATH, so no interpreter of this machine is seen.
  """
  root = tmp_path / "pyenv"
  for name, version in versions.items():
    _stub(str(root / "versions" / name / "bin" / "python3"), version)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, version in on_path:
    _stub(str(bin_dir / name), version)
  env = {"PYENV_ROOT": str(root), "HOME": str(tmp_path),
         "PATH": str(bin_dir)}
  result = subprocess.run(
      [shutil.which("bash"), "-c", f'source "{CI_RUN}" && newest_python'],
      env=env, capture_output=True, text=True, check=False, timeout=60)
  return result.returncode, result.stdout.strip(), root


def test_picks_the_newest_pyenv_python(tmp_path):
  rc, out, root = _newest(tmp_path, {"3.11.7": (3, 11, 7),
                                     "3.12.1": (3, 12, 1),
                                     "3.13.0": (3, 13, 0),
                                     "3.12.10": (3, 12, 10)})
  assert rc == 0
  assert out == str(root / "versions" / "3.13.0" / "bin" / "python3")


def test_compares_versions_as_numbers_not_names(tmp_path):
  # 3.12.10 is newer than 3.12.9, though it sorts before it as a string.
  rc, out, root = _newest(tmp_path, {"3.12.9": (3, 12, 9),
                                     "3.12.10": (3, 12, 10)})
  assert rc == 0
  assert out == str(root / "versions" / "3.12.10" / "bin" / "python3")


def test_skips_an_interpreter_that_does_not_start(tmp_path):
  rc, out, root = _newest(tmp_path, {"3.12.1": (3, 12, 1),
                                     "3.13.0": None})
  assert rc == 0
  assert out == str(root / "versions" / "3.12.1" / "bin" / "python3")


def test_falls_back_to_a_python_on_path(tmp_path):
  rc, out, _ = _newest(tmp_path, {"3.11.7": (3, 11, 7)},
                       on_path=[("python3.12", (3, 12, 3))])
  assert rc == 0
  assert out == str(tmp_path / "bin" / "python3.12")


def test_names_nothing_without_python_3_12(tmp_path):
  rc, out, _ = _newest(tmp_path, {"3.11.7": (3, 11, 7),
                                  "3.10.13": (3, 10, 13)})
  assert (rc, out) == (1, "")


def test_sourcing_runs_no_suite(tmp_path):
  # Sourcing defines the functions only: no venv is made, nothing printed.
  result = subprocess.run(
      [shutil.which("bash"), "-c", f'source "{CI_RUN}" && type run_suite'],
      cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
  assert "run_suite is a function" in result.stdout
  assert os.listdir(tmp_path) == []


def _main(tmp_path, default_rc, newest_rc, newest=True):
  """Runs `main` with each run's suite replaced by a stub exiting `*_rc`.

  A stub writes a pytest-like summary line to the run's log, as pytest does;
  returns (exit status, printed lines).
  """
  work = tmp_path / "work"
  work.mkdir()
  script = f"""
source "{CI_RUN}"
run_suite() {{
  local rc
  [[ $1 == default ]] && rc={default_rc} || rc={newest_rc}
  echo "==== $1 $rc: 3 passed, 1 deselected in 1.50s ====" > "$LOGS/$1.log"
  return $rc
}}
newest_python() {{ {"echo /opt/python3.13" if newest else "return 1"}; }}
main
"""
  result = subprocess.run([shutil.which("bash"), "-c", script], cwd=work,
                          capture_output=True, text=True, check=False,
                          timeout=60)
  return result.returncode, result.stdout.strip().splitlines()


def test_both_runs_pass_and_their_summaries_are_printed(tmp_path):
  rc, lines = _main(tmp_path, 0, 0)
  assert rc == 0
  assert lines[-4:] == [
      "[default] ok; its pytest summary:",
      "==== default 0: 3 passed, 1 deselected in 1.50s ====",
      "[newest] ok; its pytest summary:",
      "==== newest 0: 3 passed, 1 deselected in 1.50s ===="]


def test_a_run_with_no_test_fails_and_is_named(tmp_path):
  rc, lines = _main(tmp_path, 0, 5)
  assert rc == 1
  assert "[newest] FAILED (pytest ran no test); its pytest summary:" in lines
  assert lines[-1] == "CI failed: newest"


def test_a_failing_default_run_fails_ci(tmp_path):
  rc, lines = _main(tmp_path, 1, 0)
  assert rc == 1
  assert "[default] FAILED (exit status 1); its pytest summary:" in lines
  assert lines[-1] == "CI failed: default"


def test_without_a_newer_python_only_the_default_runs(tmp_path):
  rc, lines = _main(tmp_path, 0, 1, newest=False)
  assert rc == 0
  assert any(line.startswith("=== [newest] SKIPPED") for line in lines)
  assert not any(line.startswith("[newest]") for line in lines)
