"""TensorBoard event files of a run: `<workdir>/tensorboard/`.

The only module that uses the `tensorboard` package. It writes with
`tensorboard.summary.writer.event_file_writer.EventFileWriter` (the writer
PyTorch's `torch.utils.tensorboard` is built on): pure Python, no TensorFlow,
and importing it imports neither TensorFlow nor PyTorch.

Every metric becomes a scalar tagged `<stage>/<metric>` (e.g.
`rl/train/reward_mean`, `sft/eval/accuracy`) at the stage's step, with the
record's wall time. A tag gets at most one point per step, in increasing step
order: a later record that repeats a tag at a step already written (a stage's
final summary repeating its last step's metrics) is not written again;
`metrics.jsonl` keeps every record.

Resume: `replace(entries)` deletes the directory's event files and writes
one new file holding exactly `entries` (the run's `metrics.jsonl` after a
resume dropped what it will produce again), so a reader sees each step once,
also for steps that were written before a kill and are now produced again.
Rewriting is needed: TensorBoard's Python reader (`EventAccumulator`) reads
every file of a directory and would show such steps twice. A TensorBoard
already open on the run sees the new file start again at step 1; its data
server drops the points it holds at or after a step that arrives again
("preemption"), so it ends with one point per step too.
"""

import glob
import math
import os

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import event_file_writer

DIRNAME = "tensorboard"
_PATTERN = "events.out.tfevents.*"


def event_files(logdir: str) -> list[str]:
  return sorted(glob.glob(os.path.join(logdir, _PATTERN)))


class EventFileSink:
  """Mirrors metric records into TensorBoard event files under `logdir`."""

  def __init__(self, logdir: str):
    self._logdir = logdir
    self._writer = None
    self._last_step = {}  # tag -> last step written.

  def _open(self):
    os.makedirs(self._logdir, exist_ok=True)
    # flush() after every record; the writer's own timer is a backstop.
    self._writer = event_file_writer.EventFileWriter(self._logdir,
                                                     flush_secs=10)

  def replace(self, entries):
    """Makes the event files hold exactly `entries`, in one new file.

    Args:
      entries: `(stage, step, wall_time, {metric: float})` tuples in the
        order they were written (`metrics.scalar_entries`).
    """
    self.close()
    for path in event_files(self._logdir):
      os.remove(path)
    self._last_step = {}
    self._open()
    for entry in entries:
      self._add(*entry)
    self._writer.flush()

  def write(self, stage: str, step: int, wall_time: float, scalars: dict):
    if self._writer is None:
      self._open()
    self._add(stage, step, wall_time, scalars)
    self._writer.flush()

  def _add(self, stage, step, wall_time, scalars):
    values = []
    for key, number in scalars.items():
      tag = f"{stage}/{key}"
      if self._last_step.get(tag, -math.inf) >= step:
        continue
      self._last_step[tag] = step
      values.append(summary_pb2.Summary.Value(tag=tag, simple_value=number))
    if values:
      self._writer.add_event(event_pb2.Event(
          wall_time=wall_time, step=step,
          summary=summary_pb2.Summary(value=values)))

  def close(self):
    if self._writer is not None:
      self._writer.close()
      self._writer = None
