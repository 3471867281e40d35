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
"""

import math
import os
import secrets

from rl_rewards import metrics as metrics_lib

STATE_FILE = "wandb.json"
MODES = ("online", "offline")


class WandbSink:
  """Mirrors metric records into one W&B run per workdir."""

  def __init__(self, workdir: str, *, project: str, entity: str = "",
               mode: str = "online", config: dict | None = None,
               name: str = ""):
    import wandb  # pylint: disable=g-import-not-at-top
    self._workdir = workdir
    self._state_path = os.path.join(workdir, STATE_FILE)
    state = (metrics_lib.read_json(self._state_path)
             if os.path.exists(self._state_path) else {})
    run_id = state.get("run_id") or secrets.token_hex(4)
    self._last_step = dict(state.get("last_step", {}))
    self._state = {"run_id": run_id, "last_step": self._last_step}
    # The id is on disk before the run starts: a kill during init resumes it.
    self._save_state()
    kwargs = {}
    if not os.environ.get("WANDB_DIR"):
      kwargs["dir"] = os.path.abspath(workdir)
    self._run = wandb.init(
        project=project, entity=entity or None, mode=mode, id=run_id,
        resume="allow", name=name or os.path.basename(
            os.path.abspath(workdir)),
        config=config, reinit="finish_previous", **kwargs)
    self._stages = set()

  @property
  def run_id(self) -> str:
    return self._state["run_id"]

  def _save_state(self):
    metrics_lib.write_json_atomic(self._state_path, self._state)

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
