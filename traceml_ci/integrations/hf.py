"""Hugging Face ``transformers.Trainer`` callback: each optimizer step traced as one step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from traceml_ci.errors import install_hint

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        f"traceml_ci.integrations.hf needs transformers: {install_hint('hf')}"
    ) from None

from traceml_ci.integrations._driver import StepDriver

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from traceml_ci.tracer.config import RunOptions


class TraceMLCallback(TrainerCallback):
    """``Trainer(..., callbacks=[TraceMLCallback()])``: writes ``final_summary.json`` when
    training ends.

    A step is one optimizer step: with ``gradient_accumulation_steps=N`` it covers the N
    micro-batches (their fetches, forwards and backwards) and the optimizer step. The phases are
    the tracer's auto mode: the DataLoader's ``next()``, the model's outermost forward,
    ``backward()`` and ``optimizer.step()``; clipping, logging and the LR scheduler are
    ``other``. Keywords are ``traceml_ci.init``'s; under ``traceml-ci run`` its flags win.
    ``log_to=("mlflow",)`` / ``("wandb",)`` also logs the summary at train end, into the run
    the Trainer's own MLflow / W&B integration has open (docs/records.md).
    """

    def __init__(
        self, *, log_to: tuple[str, ...] | list[str] = (), **options: Unpack[RunOptions]
    ) -> None:
        self.driver = StepDriver(log_to=log_to, caller=type(self).__name__, **options)

    # Started at the Trainer's construction when possible: before the optimizer exists.
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.start()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        self.driver.open((model,) if model is not None else ())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.close()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Sent after the evaluation: it ran since the last step's end (logging before it too).
        self.driver.eval_end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.driver.finish()
