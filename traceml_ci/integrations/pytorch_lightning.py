"""The Lightning callback for the older ``pytorch_lightning`` package name."""

from __future__ import annotations

try:
    from pytorch_lightning.callbacks import Callback
except ImportError:
    raise ImportError(
        "traceml_ci.integrations.pytorch_lightning needs pytorch_lightning: "
        "pip install pytorch-lightning"
    ) from None

from traceml_ci.integrations._lightning_hooks import LightningHooks


class TraceMLCallback(LightningHooks, Callback):
    """``pytorch_lightning.Trainer(callbacks=[TraceMLCallback()])``; see ``LightningHooks``."""
