"""``traceml-ci combine``: repeated runs of one job into one summary, and its bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.gate.summaries import DATA, make, real
from traceml_ci.cli.main import main
from traceml_ci.gate import write_baseline_set
from traceml_ci.summary.schema import summary_problems


def runs_on_disk(tmp_path, *dataloader_ms: float, name: str = "train",
                 prefix: str = "head") -> list[str]:
    """``traceml-ci run --out runs/head-i train.py`` folders, one per run."""
    out = []
    for i, d in enumerate(dataloader_ms):
        folder = tmp_path / "runs" / f"{prefix}-{i}"
        folder.mkdir(parents=True)
        doc = make({"dataloader": d, "forward": 6.0, "backward": 8.0, "optimizer": 1.0,
                    "other": 1.0}, name=name)
        (folder / "final_summary.json").write_text(json.dumps(doc))
        out.append(str(folder))
    return out


def test_folders_and_files_combine_into_a_valid_summary_that_diff_reads(tmp_path, capsys):
    folders = runs_on_disk(tmp_path, 4.0, 4.2, 3.9)
    target = tmp_path / "head.json"
    files = [f"{folders[2]}/final_summary.json"]
    assert main(["combine", folders[0], folders[1], *files, "-o", str(target)]) == 0
    assert "combined 3 runs" in capsys.readouterr().err
    doc = json.loads(target.read_text())
    assert summary_problems(doc) == [] and doc["repeats"]["count"] == 3
    assert main(["diff", str(target), str(target), "--format", "markdown"]) == 0
    assert "(×3 runs)" in capsys.readouterr().out


def test_without_output_the_summary_goes_to_stdout(tmp_path, capsys):
    assert main(["combine", *runs_on_disk(tmp_path, 4.0, 5.0)]) == 0
    assert json.loads(capsys.readouterr().out)["repeats"]["runs"] == ["train", "train"]


@pytest.mark.parametrize(
    "make_bad, expected",
    [
        (lambda t: t / "missing.json", "cannot read"),
        (lambda t: (t / "empty").mkdir() or t / "empty", "folder holds no final_summary.json"),
        (lambda t: (t / "bad.json").write_text("{") and t / "bad.json", "not valid JSON"),
        (lambda t: (write_baseline_set(t / "set.json", {"k": real()}), t / "set.json")[1],
         "is a baseline set"),
        (lambda t: (t / "gpu.json").write_text(json.dumps(make(device_type="cuda",
                                                                device_name="H200")))
         and t / "gpu.json", "on one kind of machine"),
    ],
)
def test_bad_run_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, make_bad, expected):
    good = runs_on_disk(tmp_path, 4.0)[0]
    bad = make_bad(tmp_path)
    target = tmp_path / "head.json"
    target.write_text("previous")
    assert main(["combine", good, str(bad), "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and expected in err[0], err
    assert target.read_text() == "previous"  # nothing lost


def test_the_console_script_combines_real_runs():
    done = subprocess.run(
        [sys.executable, "-c", "from traceml_ci.cli.main import entry; entry()", "combine",
         str(DATA / "input_bound_a.json"), str(DATA / "input_bound_b.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert summary_problems(doc) == []
    a, b = (json.loads((DATA / f"input_bound_{x}.json").read_text()) for x in "ab")
    mean = (a["step_time"]["dataloader_pct"] + b["step_time"]["dataloader_pct"]) / 2
    assert abs(doc["step_time"]["dataloader_pct"] - mean) < 0.2


def test_runs_of_different_jobs_are_refused_unless_allowed(tmp_path, capsys):
    ours = runs_on_disk(tmp_path, 4.0, 4.1)
    theirs = runs_on_disk(tmp_path, 9.0, name="other_job", prefix="other")[0]
    target = tmp_path / "head.json"
    assert main(["combine", *ours, theirs, "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and theirs in err[0]
    assert "is run 'other_job'" in err[0] and "--allow-different-jobs" in err[0]
    assert not target.exists()
    assert main(["combine", *ours, theirs, "--allow-different-jobs", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["repeats"]["runs"] == ["train", "train", "other_job"]


def test_a_combined_input_counts_as_the_runs_it_combines(tmp_path, capsys):
    three = runs_on_disk(tmp_path, 3.0, 4.0, 5.0)
    one = runs_on_disk(tmp_path, 9.0, prefix="late")[0]
    combined = tmp_path / "three.json"
    assert main(["combine", *three, "-o", str(combined)]) == 0
    four = tmp_path / "four.json"
    assert main(["combine", str(combined), one, "-o", str(four)]) == 0
    assert "combined 4 runs" in capsys.readouterr().err
    flat = json.loads(four.read_text())
    direct = tmp_path / "direct.json"
    assert main(["combine", *three, one, "-o", str(direct)]) == 0
    direct_doc = json.loads(direct.read_text())
    assert summary_problems(flat) == [] and flat["repeats"]["count"] == 4
    # exactly as if the four runs had been combined at once: a mean of 4, not of 2
    assert flat["step_time"] == direct_doc["step_time"]
    assert flat["step_time"]["dataloader_pct"] == direct_doc["step_time"]["dataloader_pct"]


def test_a_combined_summary_without_its_runs_is_refused(tmp_path, capsys):
    combined = tmp_path / "old.json"
    assert main(["combine", *runs_on_disk(tmp_path, 3.0, 4.0), "-o", str(combined)]) == 0
    doc = json.loads(combined.read_text())
    del doc["repeats"]["step_time"]  # as an older traceml-ci wrote it
    combined.write_text(json.dumps(doc))
    assert main(["combine", str(combined), runs_on_disk(tmp_path, 5.0, prefix="x")[0]]) == 2
    err = capsys.readouterr().err
    assert str(combined) in err and "combine its original runs instead" in err
