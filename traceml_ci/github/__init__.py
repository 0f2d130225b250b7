"""GitHub glue: a small REST client for PR comments, the runner's files, and the event context.

Nothing here imports torch, the tracer or the gate: the Action calls these through the CLI.
"""
