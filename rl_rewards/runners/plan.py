"""The memory planner: what each jitted program of a pipeline needs per device.

Before a costly launch, `plan` compiles every program of the configured
pipeline (SFT update, rollout sampler, reference / value / verifier passes,
policy / value / PRM updates) ahead of time for the run's mesh, with abstract
inputs only (`jax.ShapeDtypeStruct`s carrying their shardings: no weights are
materialised), and reads `compiled.memory_analysis()`:

  total = arguments + outputs − aliased (donated) + temporaries

per device. Arguments are split into parameters, optimizer state and the
batch; temporaries are the activations (and, for the sampler, the KV cache,
also given on its own). The stage's other state that stays on the devices
while the program runs (e.g. the policy's optimizer state during the
rollout, the reference policy during the update) is added as `resident`;
`peak = total + resident` is what must fit.

The numbers are XLA:CPU's. The CPU compiler computes bfloat16 matmuls in
float32 and upcasts their operands, so for bfloat16 models the activations
(and the sampler's cache temporaries) are overstated: plans are
conservative there. The programs are built by `runners.programs`, the
same constructors the stages jit and run, so the numbers are those of the
real run.

The largest batch that fits comes from a second compile at half the rows:
memory is affine in the rows of a program (`a + b·rows`), so two compiles
give the rows at which `peak` reaches the device's memory.
"""

import dataclasses
import time
from typing import Callable, Optional, Sequence

from rl_rewards.runners import programs as programs_lib

GIB = 1024.0 ** 3


@dataclasses.dataclass
class ProgramMemory:
  """Per-device bytes of one compiled program.

  Attributes:
    name: program name, `stage/what` (e.g. `rl/policy_update`).
    rows: global batch rows it was compiled for.
    length: sequence length (slots) of its rows.
    params: parameter bytes (every model the program reads).
    optimizer: optimizer-state bytes.
    inputs: the other arguments (batch arrays, keys).
    activations: temporaries (`temp_size_in_bytes`).
    kv_cache: the sampler's KV cache (part of `activations`), else 0.
    total: arguments + outputs − aliased + temporaries.
    resident: the stage's other state on the devices meanwhile (models and
      optimizer states this program does not take as arguments).
    peak: total + resident, what must fit the device.
    compile_s: seconds to lower and compile.
    bytes_per_row: d total / d rows (from a second compile; None if not
      measured).
  """
  name: str
  rows: int
  length: int
  params: int
  optimizer: int
  inputs: int
  activations: int
  kv_cache: int
  total: int
  resident: int
  compile_s: float
  bytes_per_row: Optional[float] = None

  @property
  def peak(self) -> int:
    return self.total + self.resident

  def largest_rows(self, limit_bytes: float, unit: int) -> int:
    """Rows (a multiple of `unit`) at which `peak` stays within the limit."""
    if self.bytes_per_row is None or self.bytes_per_row <= 0:
      return self.rows if self.peak <= limit_bytes else 0
    fixed = self.peak - self.bytes_per_row * self.rows
    rows = int((limit_bytes - fixed) // self.bytes_per_row)
    return max(rows // unit * unit, 0)


def measure(program: programs_lib.Program,
            resident: int = 0) -> ProgramMemory:
  """Compiles `program` and returns its per-device memory."""
  t0 = time.time()
  compiled = program.lower().compile()
  seconds = time.time() - t0
  mem = compiled.memory_analysis()
  params = programs_lib.per_device_bytes(program.params)
  optimizer = programs_lib.per_device_bytes(program.optimizer)
  arguments = int(mem.argument_size_in_bytes)
  total = (arguments + int(mem.output_size_in_bytes) -
           int(mem.alias_size_in_bytes) + int(mem.temp_size_in_bytes))
  return ProgramMemory(
      name=program.name, rows=program.rows, length=program.length,
      params=params, optimizer=optimizer,
      inputs=max(arguments - params - optimizer, 0),
      activations=int(mem.temp_size_in_bytes), kv_cache=program.kv_cache,
      total=total, resident=resident, compile_s=seconds)


def plan(builders: Sequence[programs_lib.ProgramBuilder], *,
         largest_batch: bool = True,
         progress: Optional[Callable[[str], None]] = None
         ) -> list[ProgramMemory]:
  """Measures every program; with `largest_batch`, also its bytes per row.

  Args:
    builders: from `programs.pipeline_programs`.
    largest_batch: compile each program a second time at half its rows
      (rounded to its row unit) to get the bytes each row adds.
    progress: called with a line per compile.

  Returns:
    One `ProgramMemory` per program, in pipeline order.
  """
  out = []
  for builder in builders:
    program = builder.build(builder.rows)
    report = measure(program, builder.resident)
    if progress:
      progress(f"{report.name}: {report.peak / GIB:.2f} GiB per device "
               f"(compiled in {report.compile_s:.1f} s)")
    half = builder.rows // 2 // builder.unit * builder.unit
    if largest_batch and half > 0:
      smaller = measure(builder.build(half))
      report.bytes_per_row = (report.total - smaller.total) / (
          builder.rows - half)
    out.append(report)
  return out


def check_fits(reports: Sequence[ProgramMemory], device_memory_gb: float):
  """Raises ValueError naming every program whose peak exceeds the device."""
  limit = device_memory_gb * GIB
  too_big = [r for r in reports if r.peak > limit]
  if too_big:
    lines = "; ".join(f"{r.name} needs {r.peak / GIB:.2f} GiB" for r in
                      too_big)
    raise ValueError(f"does not fit {device_memory_gb:g} GiB per device: "
                     f"{lines}.")


def format_table(reports: Sequence[ProgramMemory],
                 builders: Sequence[programs_lib.ProgramBuilder],
                 device_memory_gb: Sequence[float]) -> str:
  """A Markdown table: one row per program, per-device GiB by part, and the
  largest rows that fit each device memory."""
  units = {b.name: b.unit for b in builders}
  head = ["step", "rows x len", "params", "optimizer", "inputs",
          "activations", "KV cache", "program", "+ resident", "peak"]
  head += [f"fits {g:g} GB / max rows" for g in device_memory_gb]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in reports:
    cells = [r.name, f"{r.rows} x {r.length}"] + [
        f"{x / GIB:.2f}" for x in (r.params, r.optimizer, r.inputs,
                                   r.activations, r.kv_cache, r.total,
                                   r.resident, r.peak)]
    for gb in device_memory_gb:
      limit = gb * GIB
      fits = "yes" if r.peak <= limit else "**no**"
      rows = r.largest_rows(limit, units[r.name])
      # Micro-batched programs barely grow with rows (only their inputs do).
      cells.append(f"{fits} / {rows if rows < 100_000 else '> 100k'}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
