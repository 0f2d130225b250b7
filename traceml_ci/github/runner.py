"""The runner's side channels: step outputs ($GITHUB_OUTPUT), the job summary, annotations."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

#: GitHub drops a step summary larger than this many bytes.
STEP_SUMMARY_LIMIT_BYTES = 1024 * 1024
SUMMARY_TRIM_NOTE = (
    "\n\n> [!NOTE]\n> Cut to fit the 1 MiB job-summary limit; see the run's artifact.\n"
)


def format_outputs(values: Mapping[str, str]) -> str:
    """``name=value`` lines; a multi-line value uses the heredoc form with a fresh delimiter."""
    out = []
    for name, value in values.items():
        if "\n" in value or "\r" in value:
            delim = f"ghadelimiter_{uuid.uuid4().hex}"
            out.append(f"{name}<<{delim}\n{value}\n{delim}\n")
        else:
            out.append(f"{name}={value}\n")
    return "".join(out)


def write_outputs(path: str | os.PathLike[str], values: Mapping[str, str]) -> None:
    """Append step outputs to the file GitHub named in GITHUB_OUTPUT."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(format_outputs(values))


def append_step_summary(path: str | os.PathLike[str], markdown: str) -> None:
    """Append ``markdown`` to the job summary, cut (at a line break) to fit GitHub's 1 MiB."""
    target = Path(path)
    used = target.stat().st_size if target.exists() else 0
    text = markdown if markdown.endswith("\n") else markdown + "\n"
    room = STEP_SUMMARY_LIMIT_BYTES - used
    data = text.encode("utf-8")
    if len(data) > room:
        keep = max(room - len(SUMMARY_TRIM_NOTE.encode("utf-8")), 0)
        cut = data[:keep].decode("utf-8", "ignore")
        text = (cut[: cut.rindex("\n")] if "\n" in cut else "") + SUMMARY_TRIM_NOTE
    with target.open("a", encoding="utf-8") as fh:
        fh.write(text)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, message: str, title: str | None = None) -> str:
    """A workflow command (``::error title=T::message``); level: notice, warning or error."""
    props = f" title={_escape_property(title)}" if title else ""
    return f"::{level}{props}::{_escape_data(message)}"
