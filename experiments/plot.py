"""Draws a run's curves to a PNG, during the run or after it.

    python -m experiments.plot --workdir=runs/default
    python -m experiments.plot --workdir=runs/default --output=/tmp/default.png

Reads `<workdir>/metrics.jsonl` and writes one PNG (default
`<workdir>/curves.png`): a row per stage present, with its reward (or loss),
held-out accuracy, response length and steps per response, verifier
agreement, time per phase and tokens/s, each against the stage's step (see
`rl_rewards/run_plots.py`). Safe to run while the run is still writing.
"""

from absl import app
from absl import flags

from rl_rewards import run_plots

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's directory.",
                               required=True)
_OUTPUT = flags.DEFINE_string(
    "output", "", "The PNG to write (default <workdir>/curves.png).")
_TITLE = flags.DEFINE_string("title", "", "Figure title (default: workdir).")
_DPI = flags.DEFINE_integer("dpi", 100, "Resolution of the PNG.")


def main(argv):
  del argv
  try:
    path = run_plots.plot_run(_WORKDIR.value, _OUTPUT.value,
                              title=_TITLE.value, dpi=_DPI.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  print(path)


if __name__ == "__main__":
  app.run(main)
