"""Summary layer: pure data. Statistics, diagnoses, schema validation, reading and writing.

Imports neither torch nor pandas: the gate and the CLI read summaries on machines without them.
"""
