"""Template builds through the SDK, sync and async, against a real daemon (builds map a private
range of ids: they need root) on a busybox base imported into its home (`tiny:v1`): a
build from a context folder (COPY, RUN, ENV, WORKDIR) streams its log live (`output` while
the step runs, `finished` last) and ends with a report of each step; the same build again is
served wholly from the cache, as the same image; a sandbox made from the template sees the
copied file and the variable; the template cannot be deleted while that sandbox runs, and can
after; a failing RUN raises BuildError with its exit code and step; a bad Dockerfile is
refused at once, naming its line; a build sleeping in a step is cancelled; a key that is not
an admin key may look but not build.

The daemon is one of this module's own, like the session's but with its home where a build
step can reach it: a step's processes run as ids of a private range, which need the home and
every folder above it open to others (`o+x`), and pytest's temporary folders are not
(`/tmp/pytest-of-root` is 0700: there a step fails with "bind the step's root failed:
Permission denied")."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import sandcell
from sandcell import (
    AsyncBuild,
    AsyncSandbox,
    AsyncSandcell,
    AsyncTemplate,
    Build,
    BuildError,
    BuildEvent,
    BuildInfo,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Sandbox,
    Sandcell,
    SandcellError,
    StepReport,
    Template,
    TemplateInfo,
)

from .conftest import REPO, Daemon, serve

BASE = "tiny:v1"
# The programs of the busybox base.
TOOLS = ("sh", "echo", "cat", "ls", "id", "rm", "mkdir", "sleep")
DOCKERFILE = """\
FROM tiny:v1
ENV GREETING=hello
WORKDIR /app
COPY data.txt ./
RUN echo "first $GREETING" && echo to-stderr >&2 && sleep 1 && echo second
"""


def _busybox_rootfs(folder: Path) -> Path:
    """A root filesystem of busybox and a few of its programs, as a tarball."""
    root = folder / "rootfs"
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "usr/bin/busybox").write_bytes(Path("/bin/busybox").read_bytes())
    (root / "usr/bin/busybox").chmod(0o755)
    for tool in TOOLS:
        (root / "usr/bin" / tool).symlink_to("busybox")
    (root / "bin").symlink_to("usr/bin")
    (root / "etc/os-release").write_text("ID=tiny\n")
    tarball = folder / "tiny.tar"
    with tarfile.open(tarball, "w") as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(root / entry, arcname=entry)
    return tarball


@pytest.fixture(scope="module")
def builds_daemon() -> Iterator[Daemon]:
    """A daemon whose home a build step can reach, with `tiny:v1` imported into it from a
    busybox root filesystem."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("template builds map a private range of ids: they need root")
    if not Path("/bin/busybox").is_file():
        pytest.skip("/bin/busybox is missing (scripts/setup.sh installs busybox-static): no base to build on")
    folder = Path(tempfile.mkdtemp(prefix="sandcell-sdk-builds-"))
    try:
        folder.chmod(0o711)
        (folder / "home").mkdir(mode=0o711)
        (folder / "allowed").mkdir()
        tarball = _busybox_rootfs(folder)
        with serve(folder / "home", folder / "allowed") as d:
            binary = os.environ.get("SANDCELL_BIN") or str(REPO / "target/release/sandcell")
            done = subprocess.run(
                [binary, "image", "import", str(tarball), "--as", BASE, "--home", str(d.home)],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stderr
            yield d
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def sandcell_env(builds_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Overrides conftest's fixture of the same name: the SDK finds this module's daemon."""
    monkeypatch.setenv("SANDCELL_API_URL", builds_daemon.url)
    monkeypatch.setenv("SANDCELL_API_KEY", builds_daemon.key)


@pytest.fixture
def context(tmp_path: Path) -> Path:
    folder = tmp_path / "ctx"
    folder.mkdir()
    (folder / "data.txt").write_text("data v1\n")
    (folder / "Dockerfile").write_text(DOCKERFILE)
    return folder


def _contiguous(events: list[BuildEvent]) -> None:
    """Numbered from 1 without a gap, `finished` last and only there."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), events
    assert [e.kind for e in events].count("finished") == 1 and events[-1].kind == "finished"


def test_a_build_streams_its_log_and_a_sandbox_runs_on_the_template(context: Path, client: Sandcell) -> None:
    build = Template.build("sdk-demo:v1", context=context, client=client)
    assert isinstance(build, Build) and build.id.startswith("bld-")
    assert build.info.name == "sdk-demo:v1" and build.info.state in ("queued", "running")
    assert not build.info.done and build.info.image is None

    # The log, live: the step's first line comes while it still runs (it sleeps before its last).
    events: list[BuildEvent] = []
    live: BuildInfo | None = None
    for event in build.logs():
        events.append(event)
        if event.kind == "output" and event.text == "first hello\n":
            live = build.refresh()
    _contiguous(events)
    assert live is not None and live.state == "running", live
    assert live.step == 3 and live.steps == 3 and len(live.step_reports) == 2
    kinds = [e.kind for e in events]
    assert kinds[0] == "base" and events[0].name == BASE and events[0].digest
    assert kinds.count("step_started") == 3 and kinds.count("step_finished") == 3
    started = [e for e in events if e.kind == "step_started"]
    assert [(e.index, e.total, e.line) for e in started] == [(1, 3, 3), (2, 3, 4), (3, 3, 5)]
    assert started[1].text == "COPY data.txt ./"
    printed = [(e.stream, e.text) for e in events if e.kind == "output"]
    assert ("stdout", "first hello\n") in printed and ("stderr", "to-stderr\n") in printed
    assert printed.index(("stdout", "first hello\n")) < printed.index(("stdout", "second\n"))
    assert all(e.index == 3 for e in events if e.kind == "output")
    assert (events[-1].state, events[-1].error) == ("succeeded", None)
    assert events[-1]["state"] == "succeeded" and events[-1].get("nothing", 1) == 1

    info = build.wait(timeout=120)
    assert info is build.info and info.ok and info.done and info.finished_at
    assert (info.state, info.step, info.steps, info.exit_code, info.error) == ("succeeded", 3, 3, None, None)
    reports = info.step_reports
    assert all(isinstance(r, StepReport) for r in reports)
    assert [(r.index, r.line, r.cached) for r in reports] == [(1, 3, False), (2, 4, False), (3, 5, False)]
    assert [r.exit_code for r in reports] == [None, None, 0]
    assert all(r.layer and r.layer.startswith("sha256:") for r in reports)
    assert reports[2].duration_ms >= 1000 and info.failed_step is None
    assert [e.step for e in events if e.kind == "step_finished"] == reports
    image = info.image
    assert image is not None and image.reference == "sdk-demo:v1" and image.digest.startswith("sha256:")
    assert image.layers == 1 + len(reports) and image.size > 0
    # The stored log is the one followed, read at once or followed again.
    assert list(build.logs(follow=False)) == events
    assert list(build.logs(follow=False, after=2)) == events[2:]
    assert list(Template.logs(build.id, client=client)) == events
    assert list(build.logs(after=len(events) - 1)) == events[-1:]

    # The template, and the builds.
    found = client.templates.get("sdk-demo:v1")
    assert isinstance(found, TemplateInfo)
    assert (found.name, found.digest, found.layers) == ("sdk-demo:v1", image.digest, image.layers)
    assert found.sandboxes == 0 and found.size == image.size
    assert "GREETING=hello" in found.env and found.workdir == "/app"
    names = [t.name for t in Template.list()]
    assert "sdk-demo:v1" in names and BASE in names and names == sorted(names)
    assert client.templates.list_builds()[0].id == build.id
    assert Template.get_build(build.id, client=client).info == info

    # The same build again, waited for by the daemon: every step from the cache, the same image.
    again = client.templates.build("sdk-demo:v1", context=context, wait=True)
    assert again.id != build.id and again.info.done
    cached = again.wait()
    assert cached.ok and [r.cached for r in cached.step_reports] == [True, True, True]
    assert cached.image is not None and cached.image.digest == image.digest
    assert [b.id for b in Template.list_builds()[:2]] == [again.id, build.id]

    # A sandbox on the template: the copied file, the variable, the working folder's files.
    with Sandbox.create(template="sdk-demo:v1", ephemeral=True, client=client) as sb:
        assert sb.info.template == "sdk-demo:v1"
        r = sb.exec("cat /app/data.txt; echo $GREETING; ls /app")
        assert r.ok, r.stderr
        assert r.stdout == "data v1\nhello\ndata.txt\n"
        assert client.templates.get("sdk-demo:v1").sandboxes == 1
        with pytest.raises(ConflictError) as refused:
            Template.delete("sdk-demo:v1", client=client)
        assert (refused.value.status, refused.value.code) == (409, "invalid_state")
    client.templates.delete("sdk-demo:v1")
    with pytest.raises(NotFoundError):
        Template.get("sdk-demo:v1")
    with pytest.raises(NotFoundError):
        client.templates.delete("sdk-demo:v1")
    assert "sdk-demo:v1" not in [t.name for t in client.templates.list()]


def test_a_failing_step_raises_build_error_with_its_exit_code(client: Sandcell) -> None:
    dockerfile = "FROM tiny:v1\nRUN echo fine\nRUN echo about to fail && exit 3\nRUN echo never\n"
    build = client.templates.build("sdk-fails", dockerfile=dockerfile)
    with pytest.raises(BuildError) as failed:
        build.wait(timeout=120)
    e = failed.value
    assert isinstance(e, SandcellError) and e.code == "build_failed" and e.status is None
    assert (e.build_id, e.state, e.exit_code) == (build.id, "failed", 3)
    assert e.step is not None and (e.step.index, e.step.line, e.step.exit_code) == (2, 3, 3)
    assert e.step.text == "RUN echo about to fail && exit 3"
    assert e.info is build.info and e.info.exit_code == 3 and e.info.error
    assert "exit code 3" in str(e) and "line 3" in str(e) and build.id in str(e)
    # Its log says what it printed and how it ended; the next step never ran.
    events = list(build.logs(follow=False))
    _contiguous(events)
    assert [ev.text for ev in events if ev.kind == "output"] == ["fine\n", "about to fail\n"]
    assert (events[-1].state, bool(events[-1].error)) == ("failed", True)
    assert events[-2].kind == "step_finished" and events[-2].step == e.step
    # Waited for by id, it fails alike; no template was made.
    with pytest.raises(BuildError) as again:
        Template.wait_for_build(build.id)
    assert again.value.exit_code == 3 and again.value.step == e.step
    with pytest.raises(NotFoundError):
        client.templates.get("sdk-fails")
    with pytest.raises(NotFoundError):
        client.templates.get_build("bld-000000000000")


def test_a_bad_dockerfile_or_input_is_refused_at_once(client: Sandcell, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as bad:
        client.templates.build("sdk-bad", dockerfile="FROM tiny:v1\nRUN echo ok\nFROBNICATE now\n")
    assert bad.value.status == 400 and bad.value.code == "invalid_argument"
    assert "line 3" in bad.value.message and "FROBNICATE" in bad.value.message.upper()
    with pytest.raises(InvalidArgumentError, match="line 2"):
        Template.build("sdk-bad", dockerfile="FROM tiny:v1\nFROM tiny:v1\n")
    with pytest.raises(InvalidArgumentError):
        Template.build("Not A Name", dockerfile="FROM tiny:v1\n")
    # Refused before anything is sent.
    with pytest.raises(ValueError, match="no Dockerfile"):
        client.templates.build("sdk-bad", context=tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        client.templates.build("sdk-bad", dockerfile="FROM tiny:v1\n", context=tmp_path / "missing")
    with pytest.raises(ValueError, match="give dockerfile"):
        client.templates.build("sdk-bad")
    with pytest.raises(TypeError, match="allow_hosts is a list"):
        client.templates.build("sdk-bad", dockerfile="FROM tiny:v1\n", allow_hosts="example.org")
    assert all(b.name != "sdk-bad" for b in client.templates.list_builds())


def test_a_build_is_cancelled_while_its_step_runs(client: Sandcell) -> None:
    dockerfile = "FROM tiny:v1\nRUN echo started && sleep 60\n"
    build = Template.build("sdk-slow", dockerfile=dockerfile, client=client)
    for event in build.logs():
        if event.kind == "output":
            assert event.text == "started\n"
            break
    with pytest.raises(sandcell.TimeoutError, match="has not ended"):
        build.wait(timeout=0.5)
    began = time.monotonic()
    info = build.cancel()
    assert info is build.info and info.state == "cancelled" and info.done and not info.ok
    assert time.monotonic() - began < 30
    with pytest.raises(BuildError) as cancelled:
        build.wait(timeout=30)  # the wait that gave up goes on, and sees the end
    assert (cancelled.value.state, cancelled.value.code) == ("cancelled", "build_cancelled")
    events = list(build.logs())
    assert (events[-1].kind, events[-1].state) == ("finished", "cancelled")
    assert build.cancel().state == "cancelled"  # an ended build is answered as it ended
    with pytest.raises(NotFoundError):
        client.templates.get("sdk-slow")


@pytest.fixture
def user_key(builds_daemon: Daemon) -> Iterator[str]:
    """A key of the admin's owner that is not an admin key."""
    url, admin = builds_daemon.url, {"X-API-Key": builds_daemon.key}
    made = httpx.post(f"{url}/v1/keys", json={"name": "sdk-templates-user"}, headers=admin)
    assert made.status_code == 201, made.text
    yield str(made.json()["key"])
    httpx.delete(f"{url}/v1/keys/{made.json()['id']}", headers=admin)


def test_only_an_admin_key_builds_or_deletes(user_key: str) -> None:
    with Sandcell(api_key=user_key) as user:
        assert BASE in [t.name for t in user.templates.list()]
        with pytest.raises(PermissionDeniedError) as denied:
            user.templates.build("sdk-user", dockerfile="FROM tiny:v1\n")
        assert denied.value.status == 403 and "admin" in denied.value.message
        with pytest.raises(PermissionDeniedError):
            Template.delete(BASE, client=user)
    assert Template.get(BASE).name == BASE


def _tar_gz(files: dict[str, str]) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


async def test_async_build_from_an_archive_and_a_sandbox_on_it() -> None:
    dockerfile = "FROM tiny:v1\nCOPY hello.txt /srv/hello.txt\nRUN cat /srv/hello.txt\n"
    async with AsyncSandcell() as client:
        build = await AsyncTemplate.build(
            "sdk-async", dockerfile=dockerfile, context=_tar_gz({"hello.txt": "hi async\n"}), client=client
        )
        assert isinstance(build, AsyncBuild)
        events = [e async for e in build.logs()]
        _contiguous(events)
        assert [e.text for e in events if e.kind == "output"] == ["hi async\n"]
        info = await AsyncTemplate.wait_for_build(build)
        assert info.ok and info.image is not None and len(info.step_reports) == 2
        assert [e async for e in AsyncTemplate.logs(build.id, False, client=client)] == events
        assert (await client.templates.get_build(build.id)).info == info
        found = await client.templates.get("sdk-async")  # `name` is `name:latest`
        assert (found.name, found.digest) == ("sdk-async:latest", info.image.digest)
        assert info.image.reference == "sdk-async:latest"
        assert "sdk-async:latest" in [t.name for t in await client.templates.list()]

        async with await AsyncSandbox.create(template="sdk-async", ephemeral=True, client=client) as sb:
            assert (await sb.exec("cat /srv/hello.txt")).stdout == "hi async\n"
            with pytest.raises(ConflictError):
                await AsyncTemplate.delete("sdk-async", client=client)
        await client.templates.delete("sdk-async")
        with pytest.raises(NotFoundError):
            await AsyncTemplate.get("sdk-async", client=client)

        failing = await client.templates.build("sdk-async-fails", dockerfile="FROM tiny:v1\nRUN exit 7\n")
        with pytest.raises(BuildError) as failed:
            await failing.wait(timeout=120)
        assert failed.value.exit_code == 7 and failed.value.step is not None
        assert [b.id for b in (await AsyncTemplate.list_builds(client=client))[:2]] == [failing.id, build.id]

