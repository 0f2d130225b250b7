"""What the gate reads: a summary or a baseline set (``files``), a TraceML (traceml-ai) summary
mapped to ours (``traceml_ai``), and a series of summaries over time (``history``, pandas)."""
