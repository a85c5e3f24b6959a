"""The examples run to completion against the test daemon, configured by the environment only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandcell import Sandbox

from .conftest import Daemon

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(name: str, daemon: Daemon, cwd: Path, *args: str, home_only: bool = False) -> str:
    env = dict(os.environ, SANDCELL_API_URL=daemon.url, SANDCELL_API_KEY=daemon.key)
    if home_only:  # found as next to `sandcell serve`: only the daemon's home is known
        del env["SANDCELL_API_URL"], env["SANDCELL_API_KEY"]
        env["SANDCELL_HOME"] = str(daemon.home)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_data_analysis_saves_a_png(daemon: Daemon, tmp_path: Path) -> None:
    out = _run("data_analysis.py", daemon, tmp_path, "chart.png")
    assert "north" in out and "chart saved to chart.png" in out
    png = (tmp_path / "chart.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    # Without an argument it writes sales.png where it runs.
    _run("data_analysis.py", daemon, tmp_path)
    assert (tmp_path / "sales.png").read_bytes().startswith(b"\x89PNG")


def test_fork_and_compare(daemon: Daemon, tmp_path: Path) -> None:
    out = _run("fork_and_compare.py", daemon, tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("snapshot sn-") and "baseline score" in lines[0]
    for name in ("clip", "drop-low", "scale"):
        assert any(line.strip().startswith(f"{name}: (score, size)") for line in lines)
    assert "(unchanged)" in out
    assert Sandbox.list(label={"example": "fork"}) == []


def test_stream_command(daemon: Daemon, tmp_path: Path) -> None:
    out = _run("stream_command.py", daemon, tmp_path, home_only=True)
    steps = [line for line in out.splitlines() if line.startswith("[") and "step" in line]
    assert [s.split()[-1] for s in steps] == ["1", "2", "3", "4", "5"]
    times = [float(s[1 : s.index("s]")]) for s in steps]
    assert times == sorted(times) and times[-1] - times[0] > 0.5  # it streamed, not collected
    assert "done: exited with code 0" in out and "(first look) step 1" in out
    assert "(rejoined" in out and "background job: exited with code 0" in out
