"""Summary layer: pure data. Statistics, diagnoses, schema validation, reading (view.py:
SummaryView, the one read-side view) and writing (model.py).

Imports neither torch nor pandas: the gate and the CLI read summaries on machines without them.
"""
