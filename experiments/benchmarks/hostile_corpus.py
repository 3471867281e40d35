r"""A deterministic corpus of adversarial model output for the verifiers.

    items = hostile_corpus.corpus(seed=0)   # >= 300 `Item`s, same every time

Model output reaches the verifiers unfiltered, so it is built here to hit
what breaks parsers: numbers with a million digits, braces and `\frac`
nested ten thousand deep, megabyte strings, unicode look-alikes of digits
and signs, lone surrogates and NUL bytes, inputs that make regular
expressions backtrack or sympy evaluate towers of powers and huge
factorials, LaTeX cut off half way, objects that are not strings at all,
and seeded random mixtures (`fuzz`) of all of these. A few ordinary answers
(`normal`) hold the placeholder `ANSWER`, which `fill` replaces with each
verifier's reference answer, so the corpus also checks that right answers
still score 1 next to hostile ones.

Categories (`CATEGORIES`): huge_number, nested, big_string, unicode,
regex_bomb, sympy_bomb, half_latex, control, wrong_type, normal, fuzz.
"""

import dataclasses
from typing import Any

import numpy as np

ANSWER = "@ANSWER@"
CATEGORIES = ("huge_number", "nested", "big_string", "unicode", "regex_bomb",
              "sympy_bomb", "half_latex", "control", "wrong_type", "normal",
              "fuzz")
_MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Item:
  """One adversarial response.

  Attributes:
    category: one of CATEGORIES.
    name: a short description, unique in the corpus.
    text: the response; a str except in the wrong_type category.
  """
  category: str
  name: str
  text: Any


def _wrapped(category, name, text):
  """The text bare, after "#### " and inside \\boxed{}."""
  return [Item(category, name, text),
          Item(category, f"{name} after ####", "The answer is\n#### " + text),
          Item(category, f"{name} boxed", r"so $\boxed{" + text + "}$")]


def _huge_numbers():
  items = []
  for digits in (10, 100, 4300, 4301, 10_000, 100_000, 1_000_000):
    items += _wrapped("huge_number", f"{digits} digits", "9" * digits)
  items += [
      Item("huge_number", "1e1000000", "1e1000000"),
      Item("huge_number", "1e-1000000", "1e-1000000"),
      Item("huge_number", "tiny decimal", "0." + "0" * 100_000 + "1"),
      Item("huge_number", "negative million digits", "-" + "8" * 1_000_000),
      Item("huge_number", "million-digit comma groups",
           "1" + ",000" * 250_000),
      Item("huge_number", "digits with a boxed answer last",
           "7" * 5_000 + r" \boxed{" + ANSWER + "}"),
      Item("huge_number", "power of ten in latex",
           r"\boxed{10^{1000000}}"),
      Item("huge_number", "hex-looking", "0x" + "f" * 10_000),
  ]
  return items


def _nested():
  items = []
  for depth in (50, 99, 100, 101, 1_000, 10_000, 100_000):
    items.append(Item("nested", f"braces {depth}",
                      "{" * depth + "1" + "}" * depth))
  for depth in (5, 20, 33, 50, 100, 1_000, 10_000):
    items.append(Item("nested", f"frac {depth}",
                      r"\boxed{" + r"\frac{1}{" * depth + "2" + "}" * depth +
                      "}"))
  for depth in (30, 200, 10_000):
    items.append(Item("nested", f"sqrt {depth}",
                      r"\sqrt{" * depth + "2" + "}" * depth))
    items.append(Item("nested", f"left-right {depth}",
                      r"\left(" * depth + "1" + r"\right)" * depth))
    items.append(Item("nested", f"parentheses {depth}",
                      "(" * depth + "1" + ")" * depth))
    items.append(Item("nested", f"brackets {depth}",
                      "[" * depth + "1" + "]" * depth))
    items.append(Item("nested", f"exponents {depth}",
                      r"\boxed{" + "2^{" * depth + "1" + "}" * depth + "}"))
  items += [
      Item("nested", "openers only", "{" * 100_000),
      Item("nested", "closers only", "}" * 100_000),
      Item("nested", "alternating unbalanced", "{(}[)]" * 10_000),
  ]
  return items


def _big_strings():
  return [
      Item("big_string", "1 MB of letters", "a" * _MB),
      Item("big_string", "1 MB of newlines", "\n" * _MB),
      Item("big_string", "1 MB of steps", "10+10=20\n" * (_MB // 9)),
      Item("big_string", "1 MB then the boxed answer",
           "x" * _MB + r"\boxed{" + ANSWER + "}"),
      Item("big_string", "1 MB of spaces then the answer",
           " " * _MB + ANSWER),
      Item("big_string", "1 MB of markers", "#### " * (_MB // 5)),
      Item("big_string", "1 MB of NUL", "\x00" * _MB),
      Item("big_string", "1 MB of one long line of digits and signs",
           "1+" * (_MB // 2)),
      Item("big_string", "1 MB of astral characters",
           "\U0001d7d2" * (_MB // 2)),
      Item("big_string", "4 MB", "b" * (4 * _MB)),
  ]


_LOOKALIKES = {
    "full-width digits": "\uff14\uff12",
    "arabic-indic digits": "\u0664\u0662",
    "devanagari digits": "\u096a\u0968",
    "math bold digits": "\U0001d7d2\U0001d7d0",
    "superscript digits": "\u2074\u00b2",
    "circled digits": "\u2463\u2461",
    "roman numeral": "\u216b",
    "vulgar fraction": "\u00bd",
    "unicode minus": "\u221242",
    "rtl override": "\u202e24",
    "rtl marks": "\u200f42\u200e",
    "zero-width space inside": "4\u200b2",
    "zero-width joiner inside": "4\u200d2",
    "combining grave": "4\u03002",
    "no-break space": "4\u00a02",
    "byte order mark": "\ufeff42",
    "variation selector": "42\ufe0f",
    "cyrillic o as zero": "4\u041e",
    "greek omicron": "\u03bf.5",
    "lone high surrogate": "42\ud800",
    "lone low surrogate": "\udc0042",
    "surrogate pair halves": "\ud83d\ude00",
    "nul inside": "4\x002",
    "emoji digits": "4\ufe0f\u20e32\ufe0f\u20e3",
    "replacement characters": "\ufffd" * 64,
}


def _unicode():
  items = []
  for name, text in _LOOKALIKES.items():
    items += _wrapped("unicode", name, text)
  return items


def _regex_bombs():
  return [Item("regex_bomb", name, text) for name, text in [
      ("comma runs", "1," * 5_000),
      ("dot runs", "1." * 5_000),
      ("minus runs", "-" * 10_000),
      ("minus-dot runs", "-." * 5_000),
      ("dollar runs", "$" * 10_000),
      ("hash runs", "#" * 10_000),
      ("marker runs", "####" * 2_500),
      ("boxed runs", r"\boxed" * 1_500),
      ("open boxed runs", r"\boxed{" * 1_400),
      ("spaces then a digit", " " * 9_990 + "1"),
      ("digit-space runs", "1 " * 5_000),
      ("letters then a bang", "a" * 9_999 + "!"),
      ("frac runs", r"\frac" * 2_000),
      ("caret runs", "^" * 10_000),
      ("empty-brace runs", "{}" * 5_000),
      ("left-right runs", r"\left(\right." * 700),
      ("backslash runs", "\\" * 10_000),
      ("equals runs", "=" * 10_000),
      ("equation chain", "1=" * 5_000),
      ("begin runs", r"\begin{" * 1_000),
      ("percent runs", "%" * 10_000),
      ("slash runs", "1/" * 5_000),
      ("power runs", "1^" * 5_000),
      ("sign soup", "+-" * 5_000 + "1"),
      ("e-notation runs", "1e" * 5_000),
      ("answer phrases", "the answer is " * 700),
      ("text runs", r"\text{" * 1_500),
      ("ampersand rows", "&" * 5_000 + r"\\" * 2_000),
      ("decimal with many commas", "1" + ",1" * 4_900 + ".5"),
      ("interval soup", "(1,2]" * 2_000),
  ]]


def _sympy_bombs():
  texts = [
      ("python power tower", "10**10**10"),
      ("caret power tower", "9^9^9^9"),
      ("latex power tower", r"\boxed{10^{10^{10^{10}}}}"),
      ("two tower", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}"),
      ("factorial", "100000!"),
      ("latex factorial", r"\boxed{(10^{6})!}"),
      ("factorial of a googol", r"\boxed{10^{100}!}"),
      ("double factorial", r"\boxed{(10^{10})!!}"),
      ("binomial", r"\boxed{\binom{10^{9}}{5 \cdot 10^{8}}}"),
      ("product", r"\boxed{\prod_{i=1}^{10^{9}} i}"),
      ("sum", r"\boxed{\sum_{n=1}^{10^{12}} n^{n}}"),
      ("integral", r"\boxed{\int_0^\infty e^{-x^{100}} \, dx}"),
      ("limit", r"\boxed{\lim_{x \to 0} \frac{\sin(x^{1000})}{x^{999}}}"),
      ("huge symbolic power", r"\boxed{x^{10^{9}} - x^{10^{9}}}"),
      ("expansion", r"\boxed{(x+1)^{100000}}"),
      ("root power", r"\boxed{\sqrt{2}^{10^{10}}}"),
      ("exp tower", r"\boxed{e^{e^{e^{e^{10}}}}}"),
      ("negative tower", r"\boxed{10^{-10^{10}}}"),
      ("gamma", r"\boxed{\Gamma(10^{10})}"),
      ("huge fraction", r"\boxed{\frac{10^{10^{5}}}{3}}"),
      ("repeating decimal", r"\boxed{0.\overline{3}}"),
      ("division by zero", r"\boxed{1/0}"),
      ("zero over zero", r"\boxed{0/0}"),
      ("infinity minus infinity", r"\boxed{\infty - \infty}"),
      ("log zero", r"\boxed{\log(0)}"),
      ("complex root", r"\boxed{(-1)^{1/3}}"),
      ("zeta", r"\boxed{\zeta(10^{9})}"),
      ("modular power", r"\boxed{10^{10^{8}} \bmod 7}"),
      ("answer plus zero tower",
       r"\boxed{" + ANSWER + r" + 0 \cdot 10^{10^{10}}}"),
      ("matrix 40x40",
       r"\boxed{\begin{pmatrix}" + r"\\".join(
           "&".join(str((i * 7 + j * 3) % 10) for j in range(40))
           for i in range(40)) + r"\end{pmatrix}}"),
      ("determinant", r"\boxed{\det\begin{pmatrix}" + r"\\".join(
          "&".join(f"x_{{{i}{j}}}" for j in range(9)) for i in range(9)) +
       r"\end{pmatrix}}"),
      ("set of ranges", r"\boxed{\{" + ",".join(str(i) for i in range(2_000))
       + r"\}}"),
      ("tuple of powers", r"\boxed{(" + ",".join(
          f"{i}^{{{i}^{{{i}}}}}" for i in range(2, 40)) + ")}"),
      ("equation with huge roots", r"\boxed{x^{1000} = 2}"),
      ("polynomial equality", r"\boxed{x = (x+1)^{50} - (x+1)^{50} + x}"),
      ("nested logs", r"\boxed{" + r"\log(" * 60 + "10" + ")" * 60 + "}"),
  ]
  return [Item("sympy_bomb", name, text) for name, text in texts]


def _half_latex():
  texts = [r"\frac{1}{", r"\boxed{", r"\boxed{\frac{", r"\begin{pmatrix}1&2",
           r"\left(", r"\right)", r"$\frac", "$$", "$", r"\sqrt[", "}}}}{{{{",
           "\\", r"\\", r"\boxed{\boxed{\boxed{", "^^^^", "_{_{_{",
           r"\frac{}{}", r"\boxed{}", r"\end{array}", r"\begin{array}{",
           r"\text{", r"\mathrm", "x^", r"\frac12\frac", r"\boxed 4",
           r"\boxed{4", r"$\boxed{4}", r"\[", r"\(", r"\operatorname{",
           r"\left\{", "&&&&", r"\boxed{" + ANSWER, r"\frac{" + ANSWER,
           r"\dfrac{1}{2", r"\sqrt{\sqrt{\sqrt{", r"\begin{cases} x",
           r"#### \boxed{", "####", r"\boxed{\text{unfinished"]
  return [Item("half_latex", f"cut {i}: {t[:24]!r}", t)
          for i, t in enumerate(texts)]


def _control():
  return [
      Item("control", "empty", ""),
      Item("control", "NUL only", "\x00"),
      Item("control", "NULs then answer", "\x00" * 1_000 + ANSWER),
      Item("control", "carriage returns", "\r" * 100 + ANSWER + "\r"),
      Item("control", "terminal escapes", "\x1b[31m" + ANSWER + "\x1b[0m"),
      Item("control", "delete characters", "\x7f" * 50),
      Item("control", "all C0 controls", "".join(map(chr, range(32)))),
      Item("control", "latin-1 noise",
           bytes(range(256)).decode("latin-1") * 4),
      Item("control", "line and paragraph separators",
           "1\u20282\u20293\x0b4\x0c5\x1c6"),
      Item("control", "private use", "\ue000" * 100),
  ]


def _wrong_types():
  return [Item("wrong_type", name, value) for name, value in [
      ("bytes", b"42"), ("int", 42), ("float", 42.0),
      ("nan", float("nan")), ("list", ["42"]), ("dict", {"answer": "42"}),
      ("bytearray", bytearray(b"42")), ("object", object()),
  ]]


def _normal():
  texts = [
      ("bare answer", ANSWER),
      ("sentence", f"The answer is {ANSWER}."),
      ("gsm8k marker", f"Adding up.\n#### {ANSWER}"),
      ("boxed", r"Therefore $\boxed{" + ANSWER + "}$."),
      ("inline math", f"${ANSWER}$"),
      ("wrong number", "The answer is 41."),
      ("spaces", f"   {ANSWER}   "),
      ("two boxes, last right", r"\boxed{0} no, \boxed{" + ANSWER + "}"),
      ("word", "forty-two"),
      ("newline", "\n"),
      ("long but fine", "Let me think. " * 300 + f"#### {ANSWER}"),
      ("answer in text", r"\text{" + ANSWER + "}"),
  ]
  return [Item("normal", name, text) for name, text in texts]


# Building blocks of the random responses.
_FUZZ_TOKENS = (
    list("0123456789+-*/^_=.,;:!?()[]{}<>|$#%& \n\t\\") +
    [r"\frac", r"\dfrac", r"\sqrt", r"\boxed", r"\left", r"\right",
     r"\cdot", r"\times", r"\pi", r"\infty", r"\begin{pmatrix}",
     r"\end{pmatrix}", r"\text{", r"\log", r"\sin", "####", "10^{",
     "!", "e^{", "x", "y", r"\{", r"\}", "\u2212", "\uff14", "\u200b",
     "\ud800", "\x00", "\u202e", "9" * 50, "{" * 20, "}" * 20, ANSWER])


def _fuzz(rng: np.random.Generator, count: int, pool: list):
  """Random token soups, and random cuts and splices of the other items."""
  items = []
  texts = [item.text for item in pool
           if isinstance(item.text, str) and len(item.text) <= 20_000]
  for i in range(count):
    mode = i % 3
    if mode == 0:
      length = int(rng.choice([5, 20, 80, 300, 3_000]))
      tokens = rng.choice(len(_FUZZ_TOKENS), size=length)
      text = "".join(_FUZZ_TOKENS[t] for t in tokens)
      name = f"soup {i} ({length} tokens)"
    elif mode == 1:
      source = texts[int(rng.integers(len(texts)))]
      cut = int(rng.integers(len(source) + 1))
      text = source[:cut]
      name = f"cut {i} at {cut}"
    else:
      a = texts[int(rng.integers(len(texts)))]
      b = texts[int(rng.integers(len(texts)))]
      text = a[:int(rng.integers(len(a) + 1))] + b[int(rng.integers(
          len(b) + 1)):]
      name = f"splice {i}"
    items.append(Item("fuzz", name, text))
  return items


def corpus(seed: int = 0, num_fuzz: int = 150) -> list[Item]:
  """The whole corpus: the fixed categories, then `num_fuzz` random items.

  Args:
    seed: seed of the fuzz items (the other items do not depend on it).
    num_fuzz: number of random items.

  Returns:
    The items, in a fixed order; the same for the same arguments.
  """
  fixed = (_huge_numbers() + _nested() + _big_strings() + _unicode() +
           _regex_bombs() + _sympy_bombs() + _half_latex() + _control() +
           _wrong_types() + _normal())
  items = fixed + _fuzz(np.random.default_rng(seed), num_fuzz, fixed)
  names = [item.name for item in items]
  assert len(set(names)) == len(names), "corpus item names must be unique"
  return items


def ordinary(count: int, seed: int = 0) -> list[Item]:
  """`count` well-behaved responses (category "normal"), for comparison:
  short reasoning ending in a number, a fraction or the ANSWER, in the
  forms models write (sentence, "####", \\boxed{}, inline math)."""
  rng = np.random.default_rng(seed)
  forms = ("The answer is {x}.", "So we get\n#### {x}", r"Thus $\boxed{{{x}}}$.",
           "${x}$", "First 3 + 4 = 7, then 7 * 6 = 42.\nAnswer: {x}")
  items = []
  for i in range(count):
    kind = i % 4
    if kind == 0:
      x = ANSWER
    elif kind == 1:
      x = str(int(rng.integers(-1000, 10_000)))
    elif kind == 2:
      x = rf"\frac{{{int(rng.integers(1, 50))}}}{{{int(rng.integers(2, 50))}}}"
    else:
      x = f"{rng.uniform(0, 100):.2f}"
    steps = "".join(f"Step {k}: {int(rng.integers(100))} + "
                    f"{int(rng.integers(100))}.\n"
                    for k in range(int(rng.integers(0, 6))))
    form = forms[int(rng.integers(len(forms)))]
    items.append(Item("normal", f"ordinary {i}", steps + form.format(x=x)))
  return items


def sample(items: list[Item], count: int, seed: int) -> list[Item]:
  """`count` items drawn without replacement (seeded), in corpus order,
  always including at least one item of every category present."""
  rng = np.random.default_rng(seed)
  chosen = set()
  for category in CATEGORIES:
    members = [i for i, item in enumerate(items) if item.category == category]
    if members:
      chosen.add(int(rng.choice(members)))
  rest = [i for i in range(len(items)) if i not in chosen]
  extra = max(0, count - len(chosen))
  chosen.update(int(i) for i in rng.choice(rest, size=min(extra, len(rest)),
                                           replace=False))
  return [items[i] for i in sorted(chosen)]


def fill(text: Any, answer: str) -> Any:
  """`text` with the ANSWER placeholder replaced (non-strings unchanged)."""
  return text.replace(ANSWER, answer) if isinstance(text, str) else text
