"""Named kill points: the process dies exactly where the environment says."""

import json
import os
import signal
import subprocess
import sys

import pytest

from rl_rewards import kill_points

ROOT = os.path.dirname(os.path.dirname(__file__))
_SCRIPT = ("from rl_rewards import kill_points\n"
           "for i in range(3):\n"
           "  kill_points.point('metrics.write',\n"
           "                    before_kill=lambda: print('half', flush=True))\n"
           "  print('passed', i + 1, flush=True)\n")


def _run(env):
  return subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT,
                        capture_output=True, text=True,
                        env=dict(os.environ, **env))


def test_kills_at_the_nth_occurrence_after_before_kill():
  out = _run({kill_points.KILL_ENV: "metrics.write:2"})
  assert out.returncode == -signal.SIGKILL
  assert out.stdout.split("\n")[:3] == ["passed 1", "half", ""]


def test_unarmed_or_other_point_does_nothing(tmp_path):
  assert _run({}).stdout.count("passed") == 3
  trace = tmp_path / "trace.jsonl"
  out = _run({kill_points.KILL_ENV: "labels.shard:1",
              kill_points.TRACE_ENV: str(trace)})
  assert out.returncode == 0 and out.stdout.count("passed") == 3
  events = [json.loads(line) for line in trace.read_text().splitlines()]
  assert [(e["name"], e["count"]) for e in events] == [
      ("metrics.write", 1), ("metrics.write", 2), ("metrics.write", 3)]


def test_a_delayed_kill_lands_later():
  script = ("import time\nfrom rl_rewards import kill_points\n"
            "kill_points.point('checkpoint.save')\nprint('after point', "
            "flush=True)\ntime.sleep(30)\nprint('survived')\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **{
                           kill_points.KILL_ENV: "checkpoint.save:1:0.2"}))
  assert out.returncode == -signal.SIGKILL
  assert out.stdout == "after point\n"


@pytest.mark.parametrize("spec", ["nope:1", "metrics.write", "metrics.write:0",
                                  "metrics.write:x", "checkpoint.save:1:-1"])
def test_bad_specs_are_rejected(spec):
  with pytest.raises(ValueError, match=kill_points.KILL_ENV):
    kill_points.parse(spec)
