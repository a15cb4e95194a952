"""Evaluation on labelled records, fitting calibration maps, and the report files."""
