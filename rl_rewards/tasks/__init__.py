"""Tasks: problems, tokenizers, step segmentation and verifiers."""
