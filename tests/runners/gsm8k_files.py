"""What the real-model tests write: GSM8K-layout rows and a word-level
tokenizer.json trained on them (no hub is reachable from the tests)."""

from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers
from tokenizers import trainers

# Ten GSM8K-layout rows: `question`, and an `answer` ending in "#### x".
ROWS = [
    {"question": f"Tom has {a} apples and buys {b} more. How many now?",
     "answer": f"He has {a} + {b} = {a + b} apples.\n\n#### {a + b}"}
    for a, b in [(2, 3), (4, 1), (5, 5), (7, 2), (1, 1), (3, 6), (8, 1),
                 (2, 2), (6, 3), (9, 0)]]


def word_level_tokenizer(special_tokens, extra_text):
  """A whitespace word-level tokenizer over ROWS and `extra_text`.

  Args:
    special_tokens: the special tokens, ids 0, 1, ... in this order; must
      include "<unk>".
    extra_text: more words (and characters) the vocabulary must hold.
  """
  tokenizer = Tokenizer(tok_models.WordLevel(unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.WordLevelTrainer(special_tokens=list(special_tokens))
  corpus = [r["question"] + r["answer"] for r in ROWS] + [extra_text]
  tokenizer.train_from_iterator(corpus, trainer)
  return tokenizer
