"""GitHub transport: a small REST client for PR comments, the runner's files, and the event context.
What the Action decides (verdict, failure, comment mode) lives in ``cli/action_gate.py``.

Nothing here imports torch, the tracer or the gate: the Action calls these through the CLI.
"""
