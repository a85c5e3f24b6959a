"""Files: write/read, listing, stat, folders, renames, streamed transfers of a large file,
imports, exports and artifacts."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import httpx
import pytest

from sandcell import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Sandbox,
    Sandcell,
)

from .conftest import Daemon

BIG = 64 * 1024 * 1024


def test_write_and_read_text_and_bytes(bare: Sandbox) -> None:
    info = bare.write_file("notes/hello.txt", "héllo\n")
    assert info.path == "/workspace/notes/hello.txt" and info.size == len("héllo\n".encode())
    assert bare.read_file("notes/hello.txt") == "héllo\n"
    raw = bytes(range(256))
    bare.write_file("/tmp/raw.bin", raw, mode=0o600)
    assert bare.read_file("/tmp/raw.bin", format="bytes") == raw
    assert bare.stat("/tmp/raw.bin").mode == 0o600
    bare.write_file("notes/hello.txt", "more\n", append=True)
    assert bare.read_file("notes/hello.txt") == "héllo\nmore\n"
    assert bare.exec("cat notes/hello.txt").stdout == "héllo\nmore\n"


def test_ls_stat_mkdir_rename_remove(bare: Sandbox) -> None:
    made = bare.mkdir("a/b/c")
    assert made.is_dir and made.kind == "dir" and made.path == "/workspace/a/b/c"
    bare.write_file("a/f.txt", "x")
    bare.exec("ln -s f.txt /workspace/a/link")
    entries = {e.name: e for e in bare.ls("a")}
    assert set(entries) == {"b", "f.txt", "link"}
    assert entries["b"].is_dir and entries["f.txt"].size == 1 and entries["link"].kind == "symlink"
    assert entries["link"].link_target == "f.txt"
    assert "a" in {e.name for e in bare.ls()}
    st = bare.stat("a/f.txt")
    assert (st.kind, st.size, st.is_dir) == ("file", 1, False) and st.mtime > 0
    moved = bare.rename("a/f.txt", "a/b/g.txt")
    assert moved.path == "/workspace/a/b/g.txt"
    assert not bare.exists("a/f.txt") and bare.exists("a/b/g.txt")
    with pytest.raises(ConflictError) as e:
        bare.remove("a")
    assert e.value.code == "directory_not_empty"
    bare.remove("a/b/g.txt")
    bare.remove("a", recursive=True)
    assert not bare.exists("a")
    with pytest.raises(NotFoundError):
        bare.stat("a")
    with pytest.raises(InvalidArgumentError) as outside:
        bare.read_file("/etc/passwd")
    assert outside.value.code == "path_outside_sandbox"


def test_large_file_round_trip_is_streamed(bare: Sandbox, tmp_path: Path) -> None:
    src, back = tmp_path / "big.bin", tmp_path / "back.bin"
    digest = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(BIG // (1 << 20)):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            f.write(chunk)
    tracemalloc.start()
    try:
        info = bare.upload(src, "big.bin")
        size = bare.download("big.bin", back)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size == BIG and size == BIG
    # Neither direction held the file: the peak is a few chunks, not 64 MiB.
    assert peak < 16 * 1024 * 1024, peak
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest.hexdigest()
    assert bare.exec("sha256sum big.bin").stdout.split()[0] == digest.hexdigest()
    # File objects work on both ends too.
    sink = io.BytesIO()
    with open(src, "rb") as f:
        bare.upload(f, "/tmp/again.bin", mode=0o644)
    assert bare.download("/tmp/again.bin", sink) == BIG
    assert hashlib.sha256(sink.getvalue()).hexdigest() == digest.hexdigest()
    with pytest.raises(NotFoundError):
        bare.download("missing.bin", tmp_path / "missing.bin")
    assert not (tmp_path / "missing.bin").exists()


def test_import_text_bytes_host_and_export(
    bare: Sandbox, daemon: Daemon, client: Sandcell, tmp_path: Path
) -> None:
    assert bare.import_files("in/t.txt", text="text\n").files == 1
    assert bare.import_files("in/b.bin", data=b"\x00\x01", mode=0o755).bytes == 2
    assert bare.read_file("in/t.txt") == "text\n" and bare.stat("in/b.bin").mode == 0o755
    (daemon.allowed / "tree").mkdir()
    (daemon.allowed / "tree" / "one.txt").write_text("1")
    (daemon.allowed / "tree" / "two.txt").write_text("22")
    got = bare.import_files("from-host", host_path=str(daemon.allowed / "tree"))
    assert (got.files, got.bytes) == (2, 3)
    assert got.path == "/workspace/from-host"  # answered resolved
    assert {e.name for e in bare.ls("from-host")} == {"one.txt", "two.txt"}
    with pytest.raises(PermissionDeniedError):
        bare.import_files("nope", host_path="/etc")
    with pytest.raises(ValueError):
        bare.import_files("x", text="a", data=b"b")

    file_export = bare.export_files("in/t.txt")
    assert file_export.kind == "file" and file_export.size == 5 and file_export.sha256
    dir_export = bare.export_files("from-host")
    assert dir_export.kind == "dir" and dir_export.signed_url
    assert {e.id for e in client.list_exports(bare.id)} == {file_export.id, dir_export.id}
    assert client.get_export(file_export.id).path == "/workspace/in/t.txt"
    out = tmp_path / "t.txt"
    assert client.download_export(file_export.id, out) == 5 and out.read_text() == "text\n"
    archive = io.BytesIO()
    client.download_export(dir_export.id, archive)
    with tarfile.open(fileobj=io.BytesIO(archive.getvalue())) as tar:
        assert {"one.txt", "two.txt"} <= {Path(n).name for n in tar.getnames()}
    # The signed link needs no key.
    assert httpx.get(daemon.url + (file_export.signed_url or "")).content == b"text\n"
    # An export outlives its sandbox and goes into another one.
    with Sandbox.create(ephemeral=True) as other:
        other.import_files("copy.txt", export_id=file_export.id)
        assert other.read_file("copy.txt") == "text\n"
    client.delete_export(file_export.id)
    client.delete_export(dir_export.id)
    with pytest.raises(NotFoundError):
        client.get_export(file_export.id)


def test_artifacts(sb: Sandbox) -> None:
    run = sb.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]); plt.savefig('outputs/chart.png')\n"
        "open('outputs/data.csv', 'w').write('a,b\\n1,2\\n')"
    )
    assert {a.path for a in run.done.artifacts} == {
        "/workspace/outputs/chart.png",
        "/workspace/outputs/data.csv",
    }
    listed = {a.path: a for a in sb.artifacts()}
    assert (
        listed["/workspace/outputs/chart.png"].mime == "image/png"
        and listed["/workspace/outputs/data.csv"].mtime
    )
    assert sb.read_file("outputs/chart.png", format="bytes").startswith(b"\x89PNG")
