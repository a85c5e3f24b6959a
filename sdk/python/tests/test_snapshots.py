"""Snapshots: take, list, show with lineage, restore, fork, delete; automatic snapshots."""

from __future__ import annotations

import pytest

from sandcell import AutoSnapshot, ConflictError, InvalidArgumentError, NotFoundError, Sandbox, Sandcell


def test_snapshot_restore_fork_and_lineage(sb: Sandbox, client: Sandcell) -> None:
    sb.run_code("import json\nstate = {'step': 1}\ndef bump(n): return state['step'] + n")
    sb.write_file("data.txt", "v1")
    snap = sb.create_snapshot("after setup", description="deps and state", tags={"stage": "1"})
    assert snap.id.startswith("sn-") and snap.sandbox_id == sb.id
    assert (snap.name, snap.description, snap.tags) == ("after setup", "deps and state", {"stage": "1"})
    assert snap.fidelity == "language" and snap.files >= 1 and snap.size > 0
    assert {"state", "bump", "json"} <= set(snap.manifest["kernels"][0]["saved"])
    assert [s.id for s in sb.list_snapshots()] == [snap.id]
    assert snap.id in {s.id for s in client.list_snapshots()}

    with Sandbox.create(snapshot_id=snap.id, ephemeral=True, labels={"from": "snap"}) as restored:
        assert restored.info.restore is not None and restored.info.restore["fidelity"] == "language"
        assert restored.info.labels == {"from": "snap"}
        assert restored.run_code("bump(1)").text == "2"
        assert restored.read_file("data.txt") == "v1"

    forks = Sandbox.fork(snap.id, 2, labels={"fork": "yes"}, metadata={"m": "1"}, timeout=600)
    try:
        assert len(forks) == 2 and forks[0].id != forks[1].id
        assert all(f.info.labels == {"fork": "yes"} and f.info.restore for f in forks)
        # Each fork goes its own way.
        forks[0].run_code("state['step'] = 10")
        forks[1].write_file("data.txt", "v2")
        assert forks[0].run_code("bump(0)").text == "10"
        assert forks[1].run_code("bump(0)").text == "1"
        assert (forks[0].read_file("data.txt"), forks[1].read_file("data.txt")) == ("v1", "v2")
        child = forks[0].create_snapshot("child")
        assert child.parent_id == snap.id
        shown = client.get_snapshot(snap.id)
        assert shown.children == [child.id] and {f.id for f in forks} <= set(shown.sandboxes or [])
        with pytest.raises(ConflictError) as e:
            client.delete_snapshot(snap.id)
        assert e.value.code == "has_children" and e.value.details == {"children": [child.id]}
        client.delete_snapshot(child.id)
    finally:
        for f in forks:
            f.kill()
            f.close()
    client.delete_snapshot(snap.id)
    with pytest.raises(NotFoundError):
        client.get_snapshot(snap.id)


def test_restore_refuses_its_own_settings(sb: Sandbox, client: Sandcell) -> None:
    snap = sb.create_snapshot()
    try:
        assert snap.name.startswith(sb.id)
        with pytest.raises(InvalidArgumentError):
            Sandbox.create("python", snapshot_id=snap.id)
        with pytest.raises(NotFoundError):
            Sandbox.fork("sn-0000000000000000")
        shared = Sandbox.fork(snap.id, client=client)
        assert shared[0].client is client
        shared[0].kill()
    finally:
        client.delete_snapshot(snap.id)


def test_ephemeral_fork_leaves_no_record(sb: Sandbox, client: Sandcell) -> None:
    snap = sb.create_snapshot()
    try:
        kept, gone = Sandbox.fork(snap.id, client=client)[0], Sandbox.fork(snap.id, ephemeral=True)[0]
        assert gone.info.ephemeral and not kept.info.ephemeral
        for fork in (kept, gone):
            fork.kill()
            fork.disconnect()
        assert Sandbox.get(kept.id, client=client).info.state == "stopped"
        with pytest.raises(NotFoundError):
            Sandbox.get(gone.id, client=client)
    finally:
        client.delete_snapshot(snap.id)


def test_auto_snapshot_settings(sb: Sandbox) -> None:
    # Never configured: the defaults, shown as they are after an empty PUT.
    assert sb.get_auto_snapshot() == AutoSnapshot(interval_secs=None, keep=3, before_reclaim=False)
    assert sb.set_auto_snapshot() == sb.get_auto_snapshot()
    got = sb.set_auto_snapshot(interval=600, keep=2, before_reclaim=True)
    assert (got.interval_secs, got.keep, got.before_reclaim) == (600, 2, True)
    assert sb.get_auto_snapshot() == got
    off = sb.set_auto_snapshot()
    assert off.interval_secs is None and not off.before_reclaim
    with pytest.raises(InvalidArgumentError):
        sb.set_auto_snapshot(interval=60, keep=0)
