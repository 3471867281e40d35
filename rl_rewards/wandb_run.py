"""Weights & Biases logging of a run (opt-in: `config.logging.wandb_project`).

The only module that uses `wandb`, and it imports it only when a sink is
created, i.e. when `config.logging.wandb_project` is set; `pip install -e
'.[wandb]'` installs it.

Metrics are logged as `<stage>/<metric>` against a per-stage x axis
`<stage>/step` (`wandb.define_metric`), since every stage counts its own
steps. The run id is kept in `<workdir>/wandb.json`, so a restarted run
resumes the same W&B run (`resume="allow"`). W&B cannot delete logged
points, so the same file records, for every metric, the last step sent to
W&B: a resumed run does not send again the steps between its checkpoint and
the kill that W&B already holds, and every metric reaches W&B once per step,
in step order. Offline runs (`wandb_mode=offline`) are written under
`<workdir>/wandb/` (or `$WANDB_DIR`); `wandb sync <that dir>/offline-run-*`
uploads them later.

The sink reads and writes no file itself: `metrics.MetricsWriter`, the only
writer of the workdir's JSON files, opens it with the saved state of
`wandb.json` and the function that saves it.
"""

import math
import os
import secrets
from typing import Callable

from rl_rewards import errors

STATE_FILE = "wandb.json"
MODES = ("online", "offline")
# What to do when W&B cannot start or log (no login, no network).
LOGIN_HELP = (
    "(config.logging.wandb_project is set: log in with `wandb login` or "
    "WANDB_API_KEY, or log offline with --config.logging.wandb_mode=offline "
    "and upload later with `wandb sync`; an empty wandb_project turns W&B "
    "off)")


class WandbSink:
  """Mirrors metric records into one W&B run per workdir.

  Args:
    workdir: the run's directory (the run's name and, without
      `$WANDB_DIR`, where W&B writes its files).
    project, entity, mode: `config.logging.wandb_*`.
    state: the saved `<workdir>/wandb.json` (`{}` for a new run):
      `run_id` and `last_step`, the last step sent per metric.
    save_state: writes that dict back to `<workdir>/wandb.json`.
    config: the run's config (the W&B run's config).
    name: the W&B run's name (default: the workdir's base name).
  """

  def __init__(self, workdir: str, *, project: str, state: dict,
               save_state: Callable[[dict], None], entity: str = "",
               mode: str = "online", config: dict | None = None,
               name: str = ""):
    import wandb  # pylint: disable=g-import-not-at-top
    self._workdir = workdir
    self._write_state = save_state
    run_id = state.get("run_id") or secrets.token_hex(4)
    self._last_step = dict(state.get("last_step", {}))
    self._state = {"run_id": run_id, "last_step": self._last_step}
    # The id is on disk before the run starts: a kill during init resumes it.
    self._save_state()
    kwargs = {}
    if not os.environ.get("WANDB_DIR"):
      kwargs["dir"] = os.path.abspath(workdir)
    try:
      self._run = wandb.init(
          project=project, entity=entity or None, mode=mode, id=run_id,
          resume="allow", name=name or os.path.basename(
              os.path.abspath(workdir)),
          config=config, reinit="finish_previous", **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      if type(e).__module__.split(".")[0] != "wandb":
        raise
      raise errors.InputError(f"W&B: {e} {LOGIN_HELP}") from e
    self._stages = set()

  @property
  def run_id(self) -> str:
    return self._state["run_id"]

  def _save_state(self):
    self._write_state(self._state)

  def replace(self, entries):
    """Sends the points of `entries` that W&B does not hold yet (it keeps
    what it has: logged points cannot be deleted)."""
    for entry in entries:
      self.write(*entry)

  def write(self, stage: str, step: int, wall_time: float, scalars: dict):
    del wall_time  # W&B stamps points itself.
    data = {}
    for key, number in scalars.items():
      tag = f"{stage}/{key}"
      if self._last_step.get(tag, -math.inf) >= step:
        continue
      data[tag] = number
    if not data:
      return
    if stage not in self._stages:
      self._stages.add(stage)
      self._run.define_metric(f"{stage}/step")
      self._run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
    data[f"{stage}/step"] = step
    self._run.log(data)
    for tag in data:
      self._last_step[tag] = step
    self._save_state()

  def close(self):
    if self._run is not None:
      self._run.finish()
      self._run = None
