"""The Lightning callback's hooks, shared by ``lightning`` and ``pytorch_lightning``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from traceml_ci.integrations._driver import StepDriver
from traceml_ci.summary.model import RunStatus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from traceml_ci.tracer.config import RunOptions


class LightningHooks:
    """A step is one optimizer step: it opens at the first ``on_train_batch_start`` after the
    previous step and closes at the ``on_train_batch_end`` of a batch that stepped an optimizer
    (so ``accumulate_grad_batches=N`` gives one step per N batches).

    The forward phase is the LightningModule's forward and that of its direct submodules with
    parameters, so ``self(x)`` and ``self.net(x)`` in ``training_step`` both count. With
    automatic optimization Lightning runs forward and backward inside
    ``optimizer.step(closure)``; the tracer counts nested phases to the innermost one.
    """

    def __init__(
        self, *, log_to: tuple[str, ...] | list[str] = (), **options: Unpack[RunOptions]
    ) -> None:
        super().__init__()
        # log_to=("mlflow",) / ("wandb",): also log the summary at train end (docs/records.md).
        self.driver = StepDriver(log_to=log_to, caller=type(self).__name__, **options)
        self._stepped = False
        self._models: tuple[Any, ...] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":  # before configure_optimizers: the tracer sees the optimizer born
            self._models = None  # this fit's module
            self.driver.start()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.driver.start()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._models is None:
            self._models = _forward_modules(pl_module)
        self.driver.open(self._models)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stepped:
            self._stepped = False
            self.driver.close()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self.driver.eval_begin()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self.driver.eval_end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stepped = False
        self.driver.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt)
        self.driver.finish(RunStatus.INTERRUPTED if interrupted else RunStatus.CRASHED)


def _forward_modules(pl_module: Any) -> tuple[Any, ...]:
    children = getattr(pl_module, "children", None)
    subs = [m for m in (children() if children else ()) if next(m.parameters(), None) is not None]
    return (pl_module, *subs)
