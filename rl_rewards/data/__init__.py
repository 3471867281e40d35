"""Data: tfds builders (array_record, no TensorFlow) and grain pipelines."""
