"""Reads compiled programs: which arrays a device holds whole.

After SPMD partitioning, every shape in a compiled program's HLO text is a
per-device shape. An activation that still has the global batch B together
with the sequence length T (or their product, B·T, after a reshape) on one
device means the batch was not split: memory then grows with the global
batch instead of the per-device batch. `global_batch_arrays` finds such
arrays, so tests and the memory planner can check that the logical sharding
took effect.
"""

import re

# A typed HLO shape such as `bf16[6,136,896]{2,1,0}`.
_SHAPE = re.compile(r"\b(?:pred|[sufc]\d+|bf16)\[([\d,]*)\]")


def _instruction_name(line: str) -> str:
  head = line.strip().split(" = ", 1)[0]
  return head.replace("ROOT ", "")


def global_batch_arrays(hlo_text: str, global_batch: int,
                        length: int) -> list[str]:
  """Instructions of a compiled program that hold a whole-batch activation.

  An array counts when its shape has a dimension equal to `global_batch`
  and one within ±1 of `length` (tokens, shifted log-probs), or a dimension
  equal to `global_batch · length` (a flattened [B·T] view). Choose B and T
  unlike any model dimension (hidden, heads, vocab, ...) so parameters never
  match.

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()`, partitioned for
      more than one device.
    global_batch: B, the batch size of the program's inputs.
    length: T, their sequence length.

  Returns:
    One `name: shape` string per offending instruction (empty when every
    activation is split over the batch axes).
  """
  lengths = {str(length - 1), str(length), str(length + 1)}
  flat = str(global_batch * length)
  found = []
  for line in hlo_text.splitlines():
    if " = " not in line:
      continue
    result = line.split(" = ", 1)[1]
    match = _SHAPE.search(result)
    if match is None:
      continue
    dims = match.group(1).split(",")
    if flat in dims or (str(global_batch) in dims and lengths & set(dims)):
      found.append(f"{_instruction_name(line)}: {match.group(0)}")
  return found
