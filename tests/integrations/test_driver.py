"""StepDriver, the callbacks' common core, with a plain torch loop: no framework needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.integrations.conftest import load_summary
from traceml_ci.errors import install_hint
from traceml_ci.integrations._driver import StepDriver
from traceml_ci.tracer import api


def train(driver: StepDriver, steps: int) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        driver.open((model,))
        driver.open((model,))  # a second begin hook in the same step: ignored
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        driver.close()


def test_hooks_make_steps_and_finish_writes_the_summary(tmp_path: Path) -> None:
    driver = StepDriver(out_dir=tmp_path, run_name="driven", warmup_steps=1)
    driver.start()
    tracer = api.current()
    driver.start()  # a second start hook (e.g. on_train_begin after on_init_end): same tracer
    assert api.current() is tracer
    train(driver, 6)
    assert driver.finish() == tmp_path / "final_summary.json"
    doc = load_summary(tmp_path)
    assert doc["step_time"]["steps_total"] == 6
    assert doc["run"]["name"] == "driven"
    assert doc["run"]["mode"] == "auto"
    assert doc["step_time"]["phase_ms"]["optimizer"] > 0


def test_a_failing_tracer_warns_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = StepDriver(out_dir=tmp_path)
    driver.start()

    def broken(*models: object) -> None:
        raise RuntimeError("tracer bug")

    monkeypatch.setattr(api, "trace_step", broken)
    train(driver, 3)  # no exception reaches the loop
    err = capsys.readouterr().err
    assert err.count("traceml-ci: warning:") == 1
    assert "tracer bug" in err and "training goes on" in err


def test_a_crashed_step_is_dropped(tmp_path: Path) -> None:
    from traceml_ci.summary.model import RunStatus

    driver = StepDriver(out_dir=tmp_path, warmup_steps=0)
    driver.start()
    train(driver, 2)
    driver.open((torch.nn.Linear(4, 1),))
    driver.finish(RunStatus.CRASHED)  # the step open at the crash
    doc = load_summary(tmp_path)
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["steps_total"] == 2


@pytest.mark.parametrize(
    ("module", "package", "hint"),
    [
        ("hf", "transformers", install_hint("hf")),
        ("lightning", "lightning", install_hint("lightning")),
        ("pytorch_lightning", "pytorch_lightning", "pip install pytorch-lightning"),
    ],
)
def test_a_callback_without_its_library_is_one_clear_import_error(
    module: str, package: str, hint: str
) -> None:
    # The library made unimportable, as if not installed.
    code = f"import sys; sys.modules[{package!r}] = None; import traceml_ci.integrations.{module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: traceml_ci.integrations.{module} needs {package}: {hint}"
    assert "During handling" not in proc.stderr  # no chained ModuleNotFoundError


def test_every_callback_takes_init_s_run_options_and_names_an_unknown_one(tmp_path: Path) -> None:
    """One options type (tracer/config.py: RunOptions) for init() and every callback: the
    same keywords pass, a misspelt one is a TypeError naming it, as a signature would."""
    from traceml_ci.integrations._lightning_hooks import LightningHooks
    from traceml_ci.integrations.hf import TraceMLCallback

    for make in (StepDriver, LightningHooks, TraceMLCallback):
        made = make(out_dir=tmp_path, run_name="r", warmup_steps=1, batch_size=4,
                    thresholds=None, log_to=["mlflow"])
        driver = made if isinstance(made, StepDriver) else made.driver
        assert driver.options == {"out_dir": tmp_path, "run_name": "r", "warmup_steps": 1,
                                  "batch_size": 4}  # None: not given
        assert driver.log_to == ("mlflow",)
        with pytest.raises(TypeError, match=r"^\w+\(\) got an unexpected keyword argument "
                                            r"'warmup'$") as info:
            make(out_dir=tmp_path, warmup=3)
        assert str(info.value).startswith(make.__name__)
    with pytest.raises(TypeError, match="unexpected keyword argument 'live'"):
        StepDriver(live=False)  # init()'s own switch, not a callback's


def test_init_names_an_unknown_keyword() -> None:
    before = api.current()
    with pytest.raises(TypeError, match=r"^init\(\) got an unexpected keyword argument 'outdir'$"):
        api.init(outdir="x")
    assert api.current() is before  # nothing started
