"""``traceml-ci history``: markdown and CSV from folders of summaries; bad paths exit 2."""

from __future__ import annotations

import json

from tests.gate.summaries import make, shift
from traceml_ci.cli.main import main


def _runs(tmp_path, n_before, n_after):
    for i in range(n_before + n_after):
        doc = make(shift(dataloader=4.0) if i >= n_before else None, name="train")
        doc["run"]["started_at"] = f"2026-11-{10 + i:02d}T08:00:00Z"
        (tmp_path / f"run-{i:02d}.json").write_text(json.dumps(doc))
    return tmp_path


def test_history_markdown(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["history", str(_runs(tmp_path, 3, 2))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### train\n")
    assert "run-03: 20.0% → 33.3% (+13.3 pp)" in out


def test_history_csv(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["history", "--format", "csv", str(_runs(tmp_path, 1, 1))]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


def test_history_bad_path_is_exit_2(tmp_path, capsys):
    assert main(["history", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err == f"traceml-ci: error: {tmp_path / 'missing'}: no such file or folder\n"


def test_history_csv_escapes_run_names(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, name in enumerate(["x\n::error ::x\x1b[2J", "train_\udcff"]):
        doc = make(name=name)
        doc["run"]["started_at"] = f"2026-11-{10 + i:02d}T08:00:00Z"
        (tmp_path / f"run-{i}.json").write_text(json.dumps(doc))
    assert main(["history", "--format", "csv", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    out.encode("utf-8")  # no lone surrogate left
    assert "\x1b" not in out and not any(line.startswith("::") for line in out.splitlines())
    assert len(out.strip().splitlines()) == 3
