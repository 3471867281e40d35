"""Progress of long host-side loops: count, rate and ETA.

    for batch in progress.track(batches, "eval greedy", total=n, unit="batches"):
      ...
    with progress.Progress("labels rollouts", total=len(prefixes),
                           unit="prefixes") as bar:
      bar.update(len(chunk))

On a terminal (stderr is a TTY) a one-line bar is redrawn in place with `\\r`
and erased when the loop ends (the stage's status lines carry the results).
Otherwise (CI logs, notebooks, output piped to a file) a plain line is printed
every `every_s` seconds while the loop runs, and one more when it ends, so a
loop shorter than `every_s` prints nothing. `configure()` sets the mode
(`config.logging.progress`: auto | bar | lines | off) and the interval
(`config.logging.progress_every_s`); the pipeline calls it. Only the primary
process shows progress, and a loop inside another loop's progress is silent.
"""

import sys
import time

from rl_rewards import metrics as metrics_lib

MODES = ("auto", "bar", "lines", "off")
_settings = {"mode": "auto", "every_s": 30.0}
_active = [0]  # Progress objects showing now (the outermost one shows).

# A bar is drawn only once its loop has run this long, and redrawn at most
# this often.
_BAR_DELAY_S = 0.5
_BAR_REDRAW_S = 0.2
_BAR_WIDTH = 24


def configure(mode: str = "auto", every_s: float = 30.0):
  """Sets how progress is shown (see the module docstring)."""
  if mode not in MODES:
    raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}.")
  _settings.update(mode=mode, every_s=float(every_s))


def format_seconds(seconds: float) -> str:
  """`42s`, `3:07`, `1:02:03`."""
  seconds = int(round(max(seconds, 0.0)))
  if seconds < 60:
    return f"{seconds}s"
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f"{minutes}:{seconds:02d}"
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{seconds:02d}"


class Progress:
  """Progress of one loop: `update(n)` after each chunk of work, `close()`
  (or a `with` block) at the end."""

  def __init__(self, desc: str, total: int | None = None, *,
               unit: str = "items", initial: int = 0, stream=None,
               mode: str | None = None, every_s: float | None = None,
               clock=time.monotonic):
    self.desc, self.total, self.unit = desc, total, unit
    self.done = self._initial = initial
    self._stream = stream or sys.stderr
    self._clock = clock
    self._start = self._last_shown = clock()
    self._every_s = _settings["every_s"] if every_s is None else every_s
    mode = mode or _settings["mode"]
    if mode == "auto":
      isatty = getattr(self._stream, "isatty", None)
      mode = "bar" if isatty is not None and isatty() else "lines"
    if _active[0] or not metrics_lib.is_primary():
      mode = "off"  # An inner loop, or not the process that prints.
    self._mode = mode
    self._shown = False  # Whether anything was printed.
    self._closed = False
    if mode != "off":
      _active[0] += 1

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def rate(self) -> float:
    """Units per second since the start (0 before any progress)."""
    elapsed = self._clock() - self._start
    done = self.done - self._initial
    return done / elapsed if elapsed > 0 and done > 0 else 0.0

  def eta(self) -> float | None:
    """Seconds left at the current rate (None if unknown)."""
    rate = self.rate()
    if self.total is None or rate <= 0:
      return None
    return max(self.total - self.done, 0) / rate

  def status(self) -> str:
    """`desc 40/100 unit (40%), 12.5 unit/s, ETA 5s`."""
    count = (f"{self.done}/{self.total} {self.unit}" if self.total is not None
             else f"{self.done} {self.unit}")
    parts = [f"[{self.desc}] {count}"]
    if self.total:
      parts[0] += f" ({100.0 * self.done / self.total:.0f}%)"
    rate, eta = self.rate(), self.eta()
    if rate > 0:
      parts.append(f"{rate:.3g} {self.unit}/s")
    if eta is not None and self.done < (self.total or 0):
      parts.append(f"ETA {format_seconds(eta)}")
    parts.append(f"elapsed {format_seconds(self._clock() - self._start)}")
    return ", ".join(parts)

  def _bar(self) -> str:
    fraction = min(self.done / self.total, 1.0) if self.total else 0.0
    filled = int(round(fraction * _BAR_WIDTH))
    bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
    return f"\r|{bar}| {self.status()}\033[K"

  def update(self, n: int = 1):
    self.done += n
    if self._mode == "off" or self._closed:
      return
    now = self._clock()
    if self._mode == "bar":
      if (now - self._start >= _BAR_DELAY_S and
          (not self._shown or now - self._last_shown >= _BAR_REDRAW_S)):
        self._write(self._bar())
        self._last_shown = now
    elif (now - self._last_shown >= self._every_s and
          (self.total is None or self.done < self.total)):
      # (The line at the end is close()'s.)
      self._write(self.status() + "\n")
      self._last_shown = now

  def _write(self, text):
    self._stream.write(text)
    self._stream.flush()
    self._shown = True

  def close(self):
    if self._closed:
      return
    self._closed = True
    if self._mode == "off":
      return
    _active[0] -= 1
    if not self._shown:
      return
    if self._mode == "bar":
      self._write("\r\033[K")  # Erase the bar.
    else:
      self._write(self.status() + " (done)\n")


def track(iterable, desc: str, total: int | None = None, *,
          unit: str = "items", weight=None, **kwargs):
  """Yields the items of `iterable`, counting each one when the loop body is
  done with it (see `Progress`).

  Args:
    iterable: the items.
    desc: what the loop does, shown in brackets.
    total: the number of items (default: `len(iterable)` if it has one).
    unit: what is counted.
    weight: item -> units of work, when items differ in cost (e.g. beam
      searches of different widths); the total is then their sum.
    **kwargs: more `Progress` arguments.
  """
  if weight is not None:
    iterable = list(iterable)
    total = sum(weight(item) for item in iterable)
  elif total is None and hasattr(iterable, "__len__"):
    total = len(iterable)
  with Progress(desc, total, unit=unit, **kwargs) as bar:
    for item in iterable:
      yield item
      bar.update(1 if weight is None else weight(item))
