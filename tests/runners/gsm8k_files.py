"""What the real-model tests write: GSM8K-layout rows and a word-level
tokenizer.json trained on them (no hub is reachable from the tests); both
come from `rl_rewards.models.tiny_hub`, which `experiments.make_tiny_hub`
uses too."""

from rl_rewards.models import tiny_hub

# Ten GSM8K-layout rows: `question`, and an `answer` ending in "#### x".
ROWS = tiny_hub.GSM8K_ROWS


def word_level_tokenizer(special_tokens, extra_text):
  """A whitespace word-level tokenizer over ROWS and `extra_text`
  (`tiny_hub.word_level_tokenizer`).

  Args:
    special_tokens: the special tokens, ids 0, 1, ... in this order; must
      include "<unk>".
    extra_text: more words (and characters) the vocabulary must hold.
  """
  return tiny_hub.word_level_tokenizer(special_tokens, extra_text, ROWS)
