"""A template build's context and Dockerfile as `POST /v1/templates` takes them: a folder packed
in memory as a gzip tar archive (its contents at the archive's top), the Dockerfile's text
given or read from the folder. Shared by the sync and async clients (the async one runs it in
a thread: it reads files)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

ContextInput = str | os.PathLike[str] | bytes
"""A build context as `Template.build(context=…)` takes it: a folder's path (packed here), or
the bytes of a tar archive (plain or gzip) sent as they are."""


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Entries without this machine's user and group (the image's owners are its own)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_folder(folder: str | os.PathLike[str]) -> bytes:
    """The folder's contents (not the folder itself) as a gzip tar archive: files, folders and
    symbolic links as they are (a link is not followed), in name order, owned by 0:0."""
    root = os.fspath(folder)
    if not os.path.isdir(root):
        raise ValueError(f"context {root!r} is not a folder")
    raw = io.BytesIO()
    # A fixed gzip time: the same folder packs to the same bytes.
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name, filter=_owned_by_root)
    return raw.getvalue()


def build_inputs(context: ContextInput | None, dockerfile: str | None) -> tuple[bytes | None, str]:
    """The context archive (None: an empty context) and the Dockerfile's text: `dockerfile`
    when given, else the context folder's `Dockerfile`."""
    if context is not None and not isinstance(context, (bytes, str, os.PathLike)):
        raise TypeError(
            f"context is a folder's path or a tar archive's bytes, not {type(context).__name__}"
        )
    if isinstance(context, (str, os.PathLike)) and not os.path.isdir(context):
        raise ValueError(f"context {os.fspath(context)!r} is not a folder")
    if dockerfile is None:
        if context is None or isinstance(context, bytes):
            raise ValueError("give dockerfile (its text), or a context folder that holds a Dockerfile")
        path = os.path.join(os.fspath(context), "Dockerfile")
        try:
            with open(path, encoding="utf-8") as f:
                dockerfile = f.read()
        except FileNotFoundError:
            raise ValueError(
                f"no Dockerfile in the context folder ({path}): give dockerfile= (its text)"
            ) from None
    elif not isinstance(dockerfile, str):
        raise TypeError(f"dockerfile is the Dockerfile's text (a str), not {type(dockerfile).__name__}")
    if context is None or isinstance(context, bytes):
        return context, dockerfile
    return pack_folder(context), dockerfile
