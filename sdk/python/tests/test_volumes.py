"""Mounts and named volumes, sync and async, against the session's daemon (whose
`mounts.allowed_paths` is `daemon.allowed`): a host folder mounted read-only is read and not
written, in both forms of a mount; an overlay takes writes without reaching the host; a host
folder outside the allow-list is a PermissionDeniedError, a bad mount path an
InvalidArgumentError; a volume written by one sandbox is read by the next once the first is
gone; volumes are made, listed, shown, refused deletion while a sandbox mounts them, deleted,
and not found after; a snapshot taken with `volumes="copy"` keeps the volume as it was, each
sandbox made from it getting a new volume of its own while the live one goes on (without it,
a restore mounts the live volume); a malformed `mounts` is refused before anything is sent."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from sandcell import (
    AsyncSandbox,
    AsyncSandcell,
    AsyncVolume,
    ConflictError,
    InvalidArgumentError,
    Mount,
    NotFoundError,
    PermissionDeniedError,
    Sandbox,
    Sandcell,
    Volume,
    VolumeCopy,
    VolumeInfo,
)

from .conftest import Daemon


def _unique(prefix: str) -> str:
    """A name no other test (nor an earlier run against the same home) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _host_folder(daemon: Daemon) -> Path:
    """A new folder inside the daemon's `mounts.allowed_paths`, holding `in.txt`."""
    folder = daemon.allowed / _unique("mount")
    folder.mkdir()
    (folder / "in.txt").write_text("from the host\n")
    return folder


def test_a_host_folder_is_mounted_read_only(daemon: Daemon) -> None:
    folder = _host_folder(daemon)
    mounts = [
        Mount.from_host(folder, "/workspace/data"),
        {"host_path": str(folder), "path": "/home/sandbox/also", "mode": "ro"},
    ]
    with Sandbox.create(ephemeral=True, mounts=mounts) as sb:
        assert sb.read_file("data/in.txt") == "from the host\n"
        assert sb.exec("cat /home/sandbox/also/in.txt").stdout == "from the host\n"
        assert [e.name for e in sb.ls("/workspace/data")] == ["in.txt"]
        written = sb.exec("echo new > /workspace/data/new.txt")
        assert not written.ok and "Read-only file system" in written.stderr
        with pytest.raises(PermissionDeniedError, match="read-only"):
            sb.write_file("/home/sandbox/also/new.txt", "x")
        # The rest of /workspace is the sandbox's own, as ever.
        assert sb.write_file("mine.txt", "mine").size == 4
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt"]


def test_an_overlay_takes_writes_without_reaching_the_host(daemon: Daemon) -> None:
    folder = _host_folder(daemon)
    with Sandbox.create(ephemeral=True, mounts=[Mount.from_host(folder, "/tmp/layer", "overlay")]) as sb:
        assert sb.exec("echo changed > /tmp/layer/in.txt && echo new > /tmp/layer/new.txt").ok
        assert sb.read_file("/tmp/layer/in.txt") == "changed\n"
        assert {e.name for e in sb.ls("/tmp/layer")} == {"in.txt", "new.txt"}
    assert (folder / "in.txt").read_text() == "from the host\n"
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt"]


def test_a_host_folder_outside_the_allow_list_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    with pytest.raises(PermissionDeniedError) as e:
        Sandbox.create(ephemeral=True, mounts=[Mount.from_host(tmp_path, "/workspace/data")])
    assert (e.value.status, e.value.code) == (403, "permission_denied")
    assert "mounts.allowed_paths" in e.value.message
    # Inside the allow-list, a path a sandbox has no such folder at is the request's fault.
    with pytest.raises(InvalidArgumentError) as bad:
        Sandbox.create(ephemeral=True, mounts=[{"host_path": str(daemon.allowed), "path": "/etc/data"}])
    assert (bad.value.status, bad.value.code) == (400, "invalid_argument")
    with pytest.raises(InvalidArgumentError):
        Sandbox.create(ephemeral=True, mounts=[{"volume": "x", "path": "/tmp/v", "mode": "sideways"}])


def test_a_volume_outlives_the_sandbox_that_wrote_it(client: Sandcell) -> None:
    name = _unique("cache")
    with Sandbox.create(ephemeral=True, mounts=[Mount.from_volume(name, "/home/sandbox/cache")]) as first:
        first.write_file("/home/sandbox/cache/note.txt", "kept")
        assert first.exec("echo more >> /home/sandbox/cache/log.txt").ok
        # Made on first use, mounted by the sandbox while it runs: not deleted meanwhile.
        shown = Volume.get(name)
        assert (shown.name, shown.sandboxes) == (name, [first.id])
        with pytest.raises(ConflictError) as refused:
            client.volumes.delete(name)
        assert (refused.value.status, refused.value.code) == (409, "invalid_state")
        assert first.id in refused.value.message
    # The first sandbox is gone; the next one reads what it left.
    assert client.volumes.get(name).sandboxes == []
    read_only = {"volume": name, "path": "/workspace/cache", "mode": "ro"}
    with Sandbox.create(ephemeral=True, mounts=[read_only]) as second:
        assert second.read_file("cache/note.txt") == "kept"
        assert second.read_file("cache/log.txt") == "more\n"
        assert not second.exec("touch /workspace/cache/x").ok  # mounted read-only this time
        assert client.volumes.get(name).sandboxes == [second.id]
    info = client.volumes.get(name)
    assert info.sandboxes == [] and info.size_bytes == len("kept") + len("more\n")
    Volume.delete(name, client=client)
    with pytest.raises(NotFoundError):
        client.volumes.get(name)


def test_volumes_are_made_listed_shown_and_deleted(client: Sandcell) -> None:
    name = _unique("data")
    made = Volume.create(name)
    assert isinstance(made, VolumeInfo)
    assert (made.name, made.size_bytes, made.sandboxes) == (name, 0, [])
    assert made.created_at[:2] == "20" and "T" in made.created_at
    listed = {v.name: v for v in Volume.list()}
    assert listed[name] == made
    assert [v.name for v in client.volumes.list()] == sorted(listed)  # by name
    assert client.volumes.get(name) == made
    with pytest.raises(ConflictError) as taken:
        client.volumes.create(name)
    assert taken.value.code == "already_exists"
    for bad in ("Upper", "-dash-first", "x" * 65, "a/b"):
        with pytest.raises(InvalidArgumentError):
            Volume.create(bad)
    client.volumes.delete(name)
    with pytest.raises(NotFoundError) as gone:
        Volume.get(name)
    assert (gone.value.status, gone.value.code) == (404, "not_found")
    with pytest.raises(NotFoundError):
        client.volumes.delete(name)
    assert name not in {v.name for v in client.volumes.list()}


def test_a_snapshot_copies_volumes_when_asked(client: Sandcell) -> None:
    name = _unique("data")
    with Sandbox.create(ephemeral=True, mounts=[Mount.from_volume(name, "/workspace/data")]) as live:
        live.write_file("data/note.txt", "then")
        snap = live.create_snapshot(volumes="copy")
        copies: list[str] = []
        try:
            assert [(v.volume, v.path) for v in snap.volumes] == [(name, "/workspace/data")]
            assert isinstance(snap.volumes[0], VolumeCopy) and snap.volumes[0].bytes > 0
            assert client.get_snapshot(snap.id).volumes == snap.volumes
            # The live volume goes on changing; the copy does not.
            live.write_file("data/note.txt", "now")
            with Sandbox.create(snapshot_id=snap.id, ephemeral=True) as restored:
                assert restored.read_file("data/note.txt") == "then"
                assert restored.info.restore is not None
                made = restored.info.restore["volumes"]
                assert [(m["from"], m["path"]) for m in made] == [(name, "/workspace/data")]
                copy = made[0]["volume"]
                copies.append(copy)
                assert copy.startswith(f"{name}-") and len(copy) == len(name) + 7
                assert client.volumes.get(copy).sandboxes == [restored.id]
                # Its own: a write reaches neither the live volume nor the next restore's.
                restored.write_file("data/note.txt", "restored")
            assert live.read_file("data/note.txt") == "now"
            with Sandbox.fork(snap.id, ephemeral=True)[0] as forked:
                assert forked.read_file("data/note.txt") == "then"
                assert forked.info.restore is not None
                again = forked.info.restore["volumes"][0]["volume"]
                copies.append(again)
                assert again.startswith(f"{name}-") and again != copy
            # Without the copy (the default), a restore mounts the live volume, as it is now.
            plain = live.create_snapshot(volumes="mount")
            try:
                assert plain.volumes == []
                with Sandbox.create(snapshot_id=plain.id, ephemeral=True) as shared:
                    assert shared.read_file("data/note.txt") == "now"
                    assert shared.info.restore is not None and "volumes" not in shared.info.restore
            finally:
                client.delete_snapshot(plain.id)
            with pytest.raises(InvalidArgumentError) as bad:
                live.create_snapshot(volumes="all")  # type: ignore[arg-type]
            assert (bad.value.status, bad.value.code) == (400, "invalid_argument")
        finally:
            client.delete_snapshot(snap.id)
    for made_name in [name, *copies]:
        client.volumes.delete(made_name)


@pytest.mark.parametrize(
    ("mounts", "error", "match"),
    [
        (Mount.from_volume("v", "/tmp/v"), TypeError, "mounts is a list"),
        ({"volume": "v", "path": "/tmp/v"}, TypeError, "mounts is a list"),
        ("/srv/data", TypeError, "mounts is a list"),
        ([("v", "/tmp/v")], TypeError, r"mounts\[0\] is a Mount or a mapping, not tuple"),
        ([{"volume": "v", "path": "/tmp/v", "readonly": True}], ValueError, "unknown: 'readonly'"),
        ([{"volume": "v"}], ValueError, "missing: 'path'"),
        ([{"path": "/tmp/v"}], ValueError, r"mounts\[0\] \('/tmp/v'\): give host_path or volume"),
        ([{"host_path": "/srv", "volume": "v", "path": "/tmp/v"}], ValueError, "exactly one"),
        ([{"volume": 7, "path": "/tmp/v"}], TypeError, "volume is a str, not int"),
        ([{"volume": "v", "path": None}], TypeError, "path is a str, not NoneType"),
    ],
)
def test_malformed_mounts_are_refused_before_sending(
    mounts: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Sandbox.create(ephemeral=True, mounts=mounts)  # type: ignore[arg-type]


def test_a_mount_names_one_source() -> None:
    assert Mount.from_host(Path("/srv/d"), "/workspace/d") == Mount("/workspace/d", host_path="/srv/d")
    assert Mount.from_volume("v", "/tmp/v", "ro") == Mount("/tmp/v", volume="v", mode="ro")
    with pytest.raises(ValueError, match="exactly one"):
        Mount("/tmp/v")
    with pytest.raises(ValueError, match="exactly one"):
        Mount("/tmp/v", host_path="/srv", volume="v")


async def test_async_mounts_and_volumes(daemon: Daemon) -> None:
    folder = _host_folder(daemon)
    name = _unique("async")
    made = await AsyncVolume.create(name)
    assert (made.name, made.sandboxes) == (name, [])
    mounts = [Mount.from_host(folder, "/workspace/data"), Mount.from_volume(name, "/workspace/out")]
    async with AsyncSandcell() as client:
        async with await AsyncSandbox.create(ephemeral=True, mounts=mounts, client=client) as sb:
            assert await sb.read_file("data/in.txt") == "from the host\n"
            assert not (await sb.exec("touch /workspace/data/x")).ok
            await sb.write_file("out/result.txt", "42")
            assert (await client.volumes.get(name)).sandboxes == [sb.id]
            with pytest.raises(ConflictError):
                await AsyncVolume.delete(name, client=client)
        assert name in {v.name for v in await client.volumes.list()}
        async with await AsyncSandbox.create(
            ephemeral=True, mounts=[Mount.from_volume(name, "/tmp/in")], client=client
        ) as again:
            assert await again.read_file("/tmp/in/result.txt") == "42"
        assert (await AsyncVolume.get(name)).size_bytes == 2
        await client.volumes.delete(name)
        with pytest.raises(NotFoundError):
            await client.volumes.get(name)
        with pytest.raises(NotFoundError):
            await AsyncVolume.delete(name)
    assert name not in {v.name for v in await AsyncVolume.list()}


async def test_async_snapshot_copies_volumes(daemon: Daemon) -> None:
    name = _unique("adata")
    copies: list[str] = []
    async with AsyncSandcell() as client:
        async with await AsyncSandbox.create(
            ephemeral=True, mounts=[Mount.from_volume(name, "/workspace/data")], client=client
        ) as live:
            await live.write_file("data/note.txt", "then")
            snap = await live.create_snapshot(volumes="copy")
            assert [(v.volume, v.path) for v in snap.volumes] == [(name, "/workspace/data")]
            await live.write_file("data/note.txt", "now")
            forks = await AsyncSandbox.fork(snap.id, 2, ephemeral=True, client=client)
            try:
                assert [await f.read_file("data/note.txt") for f in forks] == ["then", "then"]
                made = [f.info.restore["volumes"][0] for f in forks if f.info.restore is not None]
                assert [m["from"] for m in made] == [name, name]
                copies += [m["volume"] for m in made]
                assert len(set(copies)) == 2 and all(c.startswith(f"{name}-") for c in copies)
            finally:
                await asyncio.gather(*(f.kill() for f in forks))
                await asyncio.gather(*(f.close() for f in forks))
            assert await live.read_file("data/note.txt") == "now"
            await client.delete_snapshot(snap.id)
        for made_name in [name, *copies]:
            await client.volumes.delete(made_name)
