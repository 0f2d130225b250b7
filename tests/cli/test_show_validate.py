"""`traceml-ci show`, `validate`, `--version` and `--help`, in-process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.summary.builders import summary_doc
from traceml_ci._version import __version__
from traceml_ci.cli.main import build_parser, main


@pytest.fixture
def summary_file(tmp_path):
    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})
    path = tmp_path / "final_summary.json"
    path.write_text(json.dumps(doc))
    return path


def test_show_prints_split_memory_and_next_step(summary_file, capsys) -> None:
    assert main(["show", str(summary_file), "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "INPUT_BOUND" in out and "dataloader" in out and "47.0%" in out
    assert "num_workers" in out  # where to look next
    assert "peak RSS" in out


def test_show_reads_a_run_folder(summary_file, capsys) -> None:
    assert main(["show", str(summary_file.parent), "--width", "120"]) == 0
    assert "INPUT_BOUND" in capsys.readouterr().out


def test_show_a_folder_without_a_summary_is_one_line_exit_2(tmp_path, capsys) -> None:
    assert main(["show", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "final_summary.json" in err[0]


def test_show_gives_the_mean_the_share_comes_from_and_the_median_apart(tmp_path, capsys):
    """Worker DataLoaders: most steps wait ~0.35 ms, every few steps one waits long. The share
    (a ratio of sums) is large while the median is tiny; shown side by side, each labelled."""
    from tests.gate.summaries import make

    doc = make()
    st = doc["step_time"]
    shares = {"dataloader": 94.8, "forward": 2.0, "backward": 2.0, "optimizer": 0.7, "other": 0.5}
    for phase, pct in shares.items():
        st[f"{phase}_pct"] = pct
    st["phase_ms"]["dataloader"] = 0.35
    st["step_ms"]["mean"] = 10.0
    path = tmp_path / "final_summary.json"
    path.write_text(json.dumps(doc))
    assert main(["show", str(path), "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "mean ms" in out and "median ms" in out
    row = next(line for line in out.splitlines() if "dataloader" in line and "%" in line)
    assert "94.8%" in row and "9.48" in row and "0.35" in row
    assert "mean ms = share × mean step" in out


def test_show_gives_flops_with_the_prefix_that_fits(tmp_path, capsys) -> None:
    """A 647,168-FLOP step read ``0.00 GFLOP per step``: now ``647 kFLOP``, and its rate with
    a prefix too."""
    doc = summary_doc({"forward": 1.0, "backward": 2.0, "optimizer": 0.5},
                      flops_per_step=647_168.0, flops_dtype="float32")
    path = tmp_path / "final_summary.json"
    path.write_text(json.dumps(doc))
    assert main(["show", str(path), "--width", "160"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "compute:" in x)
    # 647,168 FLOP over 3.5 ms of compute: 185 MFLOP/s.
    assert "647 kFLOP per step (float32)" in line and "achieved 185 MFLOP/s" in line


def test_show_bad_file_is_one_line_exit_2(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["show", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "expected a JSON object" in err[0]


def test_validate_ok_and_errors_with_paths(summary_file, tmp_path, capsys) -> None:
    assert main(["validate", str(summary_file)]) == 0
    assert "valid" in capsys.readouterr().out
    doc = json.loads(summary_file.read_text())
    doc["step_time"]["forward_pct"] = "31"
    del doc["run"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(["validate", str(summary_file), str(bad), str(empty)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert f"{bad}: $: 'run' is a required property" in err
    assert any(line.startswith(f"{bad}: $.step_time.forward_pct: ") for line in err)
    assert f"{empty}: file is empty" in err
    assert not any("Traceback" in line for line in err)


def test_validate_reads_traceml_ai_summaries_as_what_they_are(tmp_path, capsys) -> None:
    """TraceML's own summaries (schema_version 1.9, a number) are what diff accepts: valid when
    they map to ours, and a broken or newer one says why."""
    from tests.conftest import FIXTURES

    good = [str(FIXTURES / "traceml-ai-0.5.0" / f) for f in ("input_bound.json",
                                                              "compute_bound.json")]
    assert main(["validate", *good]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all("valid (traceml-ai summary, schema_version 1.9" in line for line in out), out
    doc = json.loads(Path(good[0]).read_text())
    no_steps = json.loads(json.dumps(doc))
    del no_steps["step_time"]["global"]["median"], no_steps["step_time"]["global"]["average"]
    newer = dict(doc, schema_version=2.0)
    bad = [str(tmp_path / "no_steps.json"), str(tmp_path / "newer.json")]
    for path, d in zip(bad, (no_steps, newer), strict=True):
        Path(path).write_text(json.dumps(d))
    assert main(["validate", *bad]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{bad[0]}: traceml-ai summary has no step_time figures to map",
                   f"{bad[1]}: traceml-ai schema_version 2.0 is newer than this traceml-ci "
                   "maps (1.x); upgrade traceml-ci"]
    for path in bad:  # diff refuses the same files
        assert main(["diff", path, good[0]]) == 2
    capsys.readouterr()


def test_validate_baseline_sets_each_entry_named_by_key(tmp_path, capsys) -> None:
    """The plugin's baseline sets: the header, then every entry, each problem named by key."""
    from traceml_ci.gate import write_baseline_set

    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})
    good = tmp_path / "baseline.json"
    write_baseline_set(good, {"tests/a.py::t[1]": doc, "tests/a.py::t[2]": doc, "b": doc})
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: valid (baseline set of 3 summaries)\n"

    bad_doc = json.loads(good.read_text())
    entries = bad_doc["summaries"]
    entries["tests/a.py::t[1]"]["step_time"]["forward_pct"] = None
    del entries["b"]["run"]
    entries["evil\n::error ::x"] = entries.pop("tests/a.py::t[2]")
    entries["evil\n::error ::x"]["env"]["gpu_count"] = -1
    bad = tmp_path / "bad_set.json"
    bad.write_text(json.dumps(bad_doc))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3, err
    assert err[0] == f"{bad}: summaries[\"b\"]: invalid summary: $: 'run' is a required property"
    assert err[1] == (f'{bad}: summaries["tests/a.py::t[1]"]: invalid summary: '
                      "$.step_time.forward_pct: is null while other shares are numbers (null "
                      "only when no step was analysed)")
    assert err[2].startswith(f'{bad}: summaries["evil\\n::error ::x"]: invalid summary: '
                             "$.env.gpu_count: -1 is less than the minimum of 0")
    assert main(["diff", str(bad), str(good)]) == 2  # diff refuses it too, naming the first key
    assert f'{err[0]}\n' == capsys.readouterr().err.replace("traceml-ci: error: ", "")

    header = tmp_path / "newer_set.json"
    header.write_text(json.dumps(dict(bad_doc, schema_version="9.0")))
    assert main(["validate", str(header)]) == 2
    assert "baseline set schema version 9.0 is newer" in capsys.readouterr().err


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "traceml_ci", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == f"traceml-ci {__version__}"
    quick = subprocess.run(
        [sys.executable, "-c", "import sys; from traceml_ci.cli.main import main; "
         "main(['--version']); "
         "print(sorted(m for m in sys.modules if m.startswith('traceml_ci.cli.')))"],
        capture_output=True, text=True,
    )
    # cli/environment.py is stdlib-only: the front doors' one reader of the environment
    assert quick.stdout.splitlines() == [
        f"traceml-ci {__version__}", "['traceml_ci.cli.environment', 'traceml_ci.cli.main']"
    ]
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"run", "show", "validate"} <= set(sub.choices)
    for command in sub.choices:
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0


def test_no_command_prints_help_and_exits_2(capsys) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_summary_and_cli_layers_do_not_import_torch() -> None:
    code = (
        "import sys, traceml_ci.summary.io, traceml_ci.summary.build, traceml_ci.cli.main\n"
        "traceml_ci.cli.main.build_parser()\n"
        "bad = [m for m in ('torch', 'pandas') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _with_a_duplicate(doc: dict, where: tuple[str, ...], key: str, value: object,
                      last: bool) -> str:
    """``doc`` as JSON whose object at ``where`` holds ``key`` twice: ``value`` as the last copy
    (the one Python's parser keeps) or the first."""
    import copy

    doc = copy.deepcopy(doc)
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    text = json.dumps(parent[where[-1]])
    extra = f"{json.dumps(key)}: {json.dumps(value)}"
    twice = text[:-1] + f", {extra}}}" if last else "{" + f"{extra}, " + text[1:]
    parent[where[-1]] = "@@twice@@"
    return json.dumps(doc).replace('"@@twice@@"', twice)


@pytest.mark.parametrize("last", [True, False], ids=["bad copy last", "bad copy first"])
def test_validate_says_duplicate_key_in_one_line(tmp_path, capsys, last) -> None:
    """A summary whose step_time holds step_ms twice, one copy ``{"mean": -1}``: last, 4 lines of
    schema problems of that copy (3 to 7 as the probe varied it); first, "valid" -- the other
    copy silently won. One line now, saying duplicate key, for our summaries and traceml-ai's."""
    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})
    ours = tmp_path / "ours.json"
    ours.write_text(_with_a_duplicate(doc, ("step_time",), "step_ms", {"mean": -1}, last))
    theirs = tmp_path / "theirs.json"
    ai = json.loads((FIXTURES / "traceml-ai-0.5.0" / "input_bound.json").read_text())
    theirs.write_text(_with_a_duplicate(ai, ("step_time", "diagnosis"), "kind", "BALANCED", last))
    for path in (ours, theirs):
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "duplicate key" in err[0] and str(path) in err[0], err


def test_validate_a_negative_mean_is_one_line(tmp_path, capsys) -> None:
    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})
    doc["step_time"]["step_ms"]["mean"] = -1.0
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{path}: $.step_time.step_ms.mean: -1.0 is less than the minimum of 0"]

