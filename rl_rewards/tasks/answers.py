"""Final-answer extraction from solution and response texts.

Shared by the data readers (GSM8K "#### x" answers, MATH \\boxed{} answers)
and the outcome verifiers. Every function here runs in time linear in its
input and never uses a regular expression with nested repetition, so it is
safe on adversarial model output.
"""

import fractions
import re
from typing import Optional

GSM8K_MARKER = "####"
# Numbers longer than this are not parsed (Python refuses int() of more than
# 4300 digits; nobody's final answer is that long).
MAX_NUMBER_CHARS = 64

# Sign, digits with optional thousands commas, optional decimal part. Each
# repetition is over a single character class, so matching is linear.
_NUMBER_RE = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+")


def gsm8k_final_answer(text: str) -> Optional[str]:
  """The text after the last "####" marker, stripped; None if absent."""
  position = text.rfind(GSM8K_MARKER)
  if position < 0:
    return None
  return text[position + len(GSM8K_MARKER):].strip()


def last_boxed(text: str) -> Optional[str]:
  """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces.

  Braces are matched by counting, so "\\boxed{\\frac{1}{2}}" gives
  "\\frac{1}{2}". The form "\\boxed 5" (no braces) gives the run of
  characters up to the next whitespace or "$".

  Args:
    text: a solution text.

  Returns:
    The content, or None when there is no box or its braces do not close.
  """
  start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
  if start < 0:
    return None
  position = start + (len("\\boxed") if text.startswith("\\boxed", start)
                      else len("\\fbox"))
  if position < len(text) and text[position] == " ":
    rest = text[position:].lstrip(" ")
    if rest and rest[0] != "{":
      end = 0
      while end < len(rest) and not rest[end].isspace() and rest[end] != "$":
        end += 1
      return rest[:end] or None
    position = len(text) - len(rest)
  if position >= len(text) or text[position] != "{":
    return None
  depth = 0
  for i in range(position, len(text)):
    char = text[i]
    if char == "{":
      depth += 1
    elif char == "}":
      depth -= 1
      if depth == 0:
        return text[position + 1:i]
  return None


def max_brace_depth(text: str) -> int:
  """Deepest nesting of {}, () and [] in `text` (unbalanced closers ignored)."""
  depth = deepest = 0
  for char in text:
    if char in "{([":
      depth += 1
      deepest = max(deepest, depth)
    elif char in "})]" and depth:
      depth -= 1
  return deepest


def parse_number(text: str) -> Optional[fractions.Fraction]:
  """Exact value of a number written like "1,000", "-3", "2.50" or "$5".

  Args:
    text: the number, possibly with "$", "%", thousands commas and
      surrounding spaces.

  Returns:
    The value as a Fraction, or None if `text` is not exactly one number.
  """
  cleaned = text.strip().replace("$", "").replace("%", "").strip()
  if cleaned.endswith("."):
    cleaned = cleaned[:-1]
  if not cleaned or len(cleaned) > MAX_NUMBER_CHARS:
    return None
  if _NUMBER_RE.fullmatch(cleaned) is None:
    return None
  try:
    return fractions.Fraction(cleaned.replace(",", ""))
  except (ValueError, ZeroDivisionError):
    return None


def numbers_in(text: str) -> list[str]:
  """All number substrings of `text`, in order ("$" signs removed)."""
  return [m.group(0).rstrip(",")
          for m in _NUMBER_RE.finditer(text.replace("$", ""))]


def gsm8k_prediction_number(text: str) -> Optional[fractions.Fraction]:
  """The numeric answer of a GSM8K-style response.

  Uses, in order: the first number after the last "####"; the last
  \\boxed{} content; the last number in the text.

  Args:
    text: the response.

  Returns:
    The value, or None if no number is found.
  """
  final = gsm8k_final_answer(text)
  if final is not None:
    numbers = numbers_in(final)
    return parse_number(numbers[0]) if numbers else None
  boxed = last_boxed(text)
  if boxed is not None:
    numbers = numbers_in(boxed)
    return parse_number(numbers[-1]) if numbers else None
  numbers = numbers_in(text)
  return parse_number(numbers[-1]) if numbers else None
