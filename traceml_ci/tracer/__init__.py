"""Tracer layer: the hot path. Hooks, clocks and compact per-step buffers; imports torch."""
