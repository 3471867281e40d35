"""Data: file readers (JSONL, JSON, Parquet), tfds builders (array_record,
no TensorFlow) and grain pipelines."""
