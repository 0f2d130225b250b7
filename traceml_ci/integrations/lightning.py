"""Lightning (``lightning.Trainer``) callback: each optimizer step traced as one step."""

from __future__ import annotations

from traceml_ci.errors import install_hint

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    raise ImportError(
        f"traceml_ci.integrations.lightning needs lightning: {install_hint('lightning')}"
    ) from None

from traceml_ci.integrations._lightning_hooks import LightningHooks


class TraceMLCallback(LightningHooks, Callback):
    """``lightning.Trainer(callbacks=[TraceMLCallback()])``: writes ``final_summary.json`` when
    training ends. Keywords are ``traceml_ci.init``'s; see ``LightningHooks`` for the phases."""
