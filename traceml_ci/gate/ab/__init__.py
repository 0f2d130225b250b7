"""A/B mode: base and head run in interleaved rounds on one machine, and their paired figures
decide (docs/gate.md, "A/B mode"). ``rounds``: what one round of a side contributes;
``intervals``: the per-round differences as Student-t intervals (``tdist``); ``sequential``:
the decision after each round; ``report``: the result as text, markdown and JSON."""
