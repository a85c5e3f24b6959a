"""`create_session` with an image, driven by the official MCP client on an embedded engine:
the scenario makes a tiny root filesystem (busybox, and bash with the libraries it links,
copied from the host), imports it into the home with `sandcell image import`, opens a session
on it and checks that commands run on the image's system; an image the store lacks is a tool
error saying how to import one.

Usage: image.py <sandcell binary> <home>
Prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import check, text_of


def make_image(binary, home):
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "rootfs")
        bin_dir = os.path.join(root, "usr", "bin")
        os.makedirs(bin_dir)
        shutil.copy("/bin/busybox", os.path.join(bin_dir, "busybox"))
        for tool in ("sh", "cat", "head", "id"):
            os.symlink("busybox", os.path.join(bin_dir, tool))
        shutil.copy("/usr/bin/bash", os.path.join(bin_dir, "bash"))
        # bash's libraries, at the paths the host's loader names.
        for lib in re.findall(r"(/\S+\.so[.\d]*)", subprocess.run(
                ["ldd", "/usr/bin/bash"], capture_output=True, text=True, check=True).stdout):
            dest = os.path.join(root, os.path.realpath(lib).lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(lib, dest)
            link = os.path.join(root, lib.lstrip("/"))
            if not os.path.exists(link):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(os.path.realpath(lib), link)
        for name in ("bin", "lib", "lib64"):
            if os.path.isdir(os.path.join(root, "usr", name)) and not os.path.exists(os.path.join(root, name)):
                os.symlink(f"usr/{name}", os.path.join(root, name))
        os.makedirs(os.path.join(root, "etc"))
        with open(os.path.join(root, "etc", "os-release"), "w") as f:
            f.write("ID=tiny\n")
        tarball = os.path.join(tmp, "tiny.tar")
        with tarfile.open(tarball, "w") as t:
            t.add(root, arcname=".")
        out = subprocess.run([binary, "image", "import", tarball, "--as", "tiny:v1", "--home", home],
                             capture_output=True, text=True)
        check("the image is imported", out.returncode == 0, out.stderr)


async def scenario(session):
    await session.initialize()
    r = await session.call_tool("create_session", {"image": "tiny:v1"})
    check("create_session with an image", not r.is_error, text_of(r))
    sid = text_of(r).split("session_id: ")[1].split()[0]
    r = await session.call_tool("execute_terminal", {
        "session_id": sid, "command": "cat /etc/os-release; busybox | head -1; id -u"})
    out = text_of(r)
    check("commands run on the image's system",
          not r.is_error and "ID=tiny" in out and "BusyBox" in out and "65532" in out, out)
    r = await session.call_tool("create_session", {"image": "nope:v1"})
    check("an image the store lacks is a tool error saying how to import one",
          r.is_error and "sandcell image import" in text_of(r), text_of(r))
    r = await session.call_tool("destroy_session", {"session_id": sid})
    check("destroy", not r.is_error, text_of(r))

    # A template built through the tools, its context given as files, then a session on it.
    r = await session.call_tool("template_build", {
        "name": "built",
        "dockerfile": "FROM tiny:v1\nCOPY hello.txt /etc/hello\nRUN echo from-build > /etc/built\n",
        "files": {"hello.txt": "hi there\n"},
    })
    answer = json.loads(text_of(r)) if not r.is_error else {}
    check("template_build builds and waits", answer.get("state") == "succeeded"
          and len(answer.get("finished_steps", [])) == 2
          and answer.get("template", {}).get("name") == "built:latest", text_of(r))
    r = await session.call_tool("template_list", {})
    check("template_list shows it", not r.is_error and "built:latest" in text_of(r), text_of(r))
    r = await session.call_tool("create_session", {"image": "built"})
    check("a session on the built template", not r.is_error, text_of(r))
    sid = text_of(r).split("session_id: ")[1].split()[0]
    r = await session.call_tool("execute_terminal", {"session_id": sid, "command": "cat /etc/hello /etc/built"})
    check("it has the build's files", "hi there" in text_of(r) and "from-build" in text_of(r), text_of(r))
    await session.call_tool("destroy_session", {"session_id": sid})
    r = await session.call_tool("template_build", {
        "name": "broken", "dockerfile": "FROM tiny:v1\nRUN echo failing-step; exit 5\n"})
    answer = json.loads(text_of(r)) if not r.is_error else {}
    check("a failing build says which step and shows its output", answer.get("state") == "failed"
          and "exit code 5" in " ".join(answer.get("finished_steps", []))
          and "failing-step" in answer.get("log_tail", ""), text_of(r))
    r = await session.call_tool("template_build", {"name": "x", "dockerfile": "FROM tiny:v1\nONBUILD RUN x\n"})
    check("a bad Dockerfile is a tool error naming the line", r.is_error and "line 2" in text_of(r), text_of(r))

    # A volume outlives the session that wrote it; host folders need the server's allow-list.
    r = await session.call_tool("create_session", {"mounts": [{"volume": "notes", "path": "/workspace/notes"}]})
    check("a session with a volume", not r.is_error, text_of(r))
    sid = text_of(r).split("session_id: ")[1].split()[0]
    r = await session.call_tool("execute_terminal", {
        "session_id": sid, "command": "echo kept > /workspace/notes/n.txt && echo wrote"})
    check("it writes to the volume", "wrote" in text_of(r), text_of(r))
    await session.call_tool("destroy_session", {"session_id": sid})
    r = await session.call_tool("create_session", {
        "mounts": [{"volume": "notes", "path": "/tmp/notes", "mode": "ro"}]})
    sid = text_of(r).split("session_id: ")[1].split()[0]
    r = await session.call_tool("execute_terminal", {
        "session_id": sid, "command": "cat /tmp/notes/n.txt; echo more >> /tmp/notes/n.txt || echo refused"})
    check("the next session reads it, read-only when asked",
          "kept" in text_of(r) and "refused" in text_of(r), text_of(r))
    await session.call_tool("destroy_session", {"session_id": sid})
    r = await session.call_tool("create_session", {"mounts": [{"host_path": "/etc", "path": "/workspace/etc"}]})
    check("a host folder the server does not allow is a tool error naming the setting",
          r.is_error and "mounts.allowed_paths" in text_of(r), text_of(r))


async def main():
    binary, home = sys.argv[1], sys.argv[2]
    make_image(binary, home)
    params = StdioServerParameters(command=binary, args=["mcp", "--home", home])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await scenario(session)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
