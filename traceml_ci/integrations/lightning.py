"""Lightning (``lightning.Trainer``) callback: each optimizer step traced as one step."""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    raise ImportError(
        "traceml_ci.integrations.lightning needs lightning: pip install 'traceml-ci[lightning]'"
    ) from None

from traceml_ci.integrations._lightning_hooks import LightningHooks


class TraceMLCallback(LightningHooks, Callback):
    """``lightning.Trainer(callbacks=[TraceMLCallback()])``: writes ``final_summary.json`` when
    training ends. Keywords are ``traceml_ci.init``'s; see ``LightningHooks`` for the phases."""
