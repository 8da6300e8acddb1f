"""Sampling a worker with py-spy while it is under load, and its hot spots from the samples.

`py-spy record --format raw` writes collapsed stacks (`frame;frame;... count`, leaf last). A
function's own share is the samples with it as the leaf; its total share is the samples with it
anywhere on the stack. Idle samples (the event loop waiting) are left out by py-spy, so shares
are of the time the worker was busy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# "function (path/to/module.py:123)"; the line is dropped so a function's lines add up.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy_path() -> str | None:
    """py-spy beside this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass(frozen=True, slots=True)
class HotSpot:
    """A function and its shares of the busy samples, in percent."""

    function: str
    own: float
    total: float


@dataclass(frozen=True, slots=True)
class Profile:
    """What the samples of one operation's load say."""

    samples: int
    by_own: list[HotSpot]
    by_total_in_app: list[HotSpot]
    by_package: list[HotSpot]


def start_recording(pid: int, *, seconds: float, output: Path) -> subprocess.Popen[bytes]:
    """Start py-spy on `pid` for `seconds`, writing collapsed stacks to `output`."""
    binary = py_spy_path()
    if binary is None:
        raise RuntimeError("py-spy is not installed")
    return subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            "200",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _short(frame: str) -> str:
    matched = _FRAME.match(frame.strip())
    if matched is None:
        return frame.strip()
    path = matched["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{matched['function']} ({path})"


def _package(frame: str) -> str:
    matched = _FRAME.match(frame)
    path = matched["file"] if matched else frame
    return path.split("/", 1)[0] if "/" in path else path.removesuffix(".py")


def hot_spots(collapsed: str, *, top: int = 10, app_prefix: str = "app/") -> Profile:
    """The `top` functions by own share, the `top` of the service's own code by total, and
    the own shares by package (the first part of the frame's path)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        packages[_package(frames[-1])] += count
        for name in set(frames):
            total[name] += count

    def share(n: int) -> float:
        return 100 * n / samples if samples else 0.0

    # The command line's frames hold every sample of the worker: they say nothing.
    in_app = [
        (name, n)
        for name, n in total.most_common()
        if f"({app_prefix}" in name and f"({app_prefix}cli.py)" not in name
    ]
    return Profile(
        samples=samples,
        by_own=[
            HotSpot(function=name, own=share(n), total=share(total[name]))
            for name, n in own.most_common(top)
        ],
        by_total_in_app=[
            HotSpot(function=name, own=share(own[name]), total=share(n)) for name, n in in_app[:top]
        ],
        by_package=[
            HotSpot(function=name, own=share(n), total=share(n))
            for name, n in packages.most_common()
        ],
    )
