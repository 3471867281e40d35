"""Progress of long loops: plain lines off a terminal, a bar on one."""

import io

import pytest

from rl_rewards import progress


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class _Terminal(io.StringIO):

  def isatty(self):
    return True


def test_plain_lines_with_rate_and_eta_every_interval():
  clock, out = _Clock(), io.StringIO()
  with progress.Progress("labels: prefix rollouts", 10, unit="batches",
                         stream=out, every_s=30.0, clock=clock) as bar:
    for _ in range(10):
      clock.now += 10.0
      bar.update()
  lines = out.getvalue().splitlines()
  # A line every 30 s (after batches 3, 6, 9) and one at the end.
  assert lines == [
      "[labels: prefix rollouts] 3/10 batches (30%), 0.1 batches/s, "
      "ETA 1:10, elapsed 30s",
      "[labels: prefix rollouts] 6/10 batches (60%), 0.1 batches/s, "
      "ETA 40s, elapsed 1:00",
      "[labels: prefix rollouts] 9/10 batches (90%), 0.1 batches/s, "
      "ETA 10s, elapsed 1:30",
      "[labels: prefix rollouts] 10/10 batches (100%), 0.1 batches/s, "
      "elapsed 1:40 (done)",
  ]


def test_a_loop_shorter_than_the_interval_prints_nothing():
  clock, out = _Clock(), io.StringIO()
  for _ in progress.track(range(5), "eval greedy", stream=out, every_s=30.0,
                          clock=clock):
    clock.now += 1.0
  assert out.getvalue() == ""


def test_bar_on_a_terminal_is_redrawn_in_place_and_erased():
  clock, out = _Clock(), _Terminal()
  with progress.Progress("eval pass@8", 4, unit="batches", stream=out,
                         clock=clock) as bar:
    for _ in range(4):
      clock.now += 1.0
      bar.update()
  text = out.getvalue()
  assert "\n" not in text
  frames = text.split("\r")[1:]
  assert frames[0].startswith("|######------------------| [eval pass@8] "
                              "1/4 batches (25%), 1 batches/s, ETA 3s")
  assert "|########################| [eval pass@8] 4/4" in frames[-2]
  assert frames[-1] == "\033[K"  # Erased at the end.


def test_weighted_items_and_nesting():
  clock, out = _Clock(), io.StringIO()
  inner_out = io.StringIO()
  seen = []
  for width in progress.track([1, 2, 4], "search pav", unit="beam rows",
                              weight=lambda w: 10 * w, stream=out,
                              every_s=1.0, clock=clock):
    # An inner loop while the outer one shows: silent.
    for _ in progress.track(range(3), "inner", stream=inner_out,
                            every_s=0.0, clock=clock):
      clock.now += width
    seen.append(width)
  assert seen == [1, 2, 4]
  assert inner_out.getvalue() == ""
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("[search pav] 10/70 beam rows (14%)")
  assert lines[-1].startswith("[search pav] 70/70 beam rows (100%)")


def test_off_and_bad_mode():
  out = io.StringIO()
  with progress.Progress("x", 2, stream=out, mode="off", every_s=0.0) as bar:
    bar.update(2)
  assert out.getvalue() == ""
  with pytest.raises(ValueError, match="progress mode"):
    progress.configure("fancy")


def test_format_seconds():
  assert [progress.format_seconds(s) for s in (4.4, 59.6, 187, 3723)] == [
      "4s", "1:00", "3:07", "1:02:03"]
