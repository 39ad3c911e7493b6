"""Agent bundles: the .tar.gz form in which a spec is uploaded.

A session is created by uploading a bundle; the server, and `load_spec` for a
.tar.gz path, read it back with `spec_from_bundle`. Bundles come from clients,
so reading happens in memory only and every step is bounded: the packed and
unpacked size, the member count, member paths, and the YAML's event count
(libyaml's composer is cheap per byte but not per node: a hostile 300 KiB
document took seconds). The server runs `spec_from_bundle` in a worker thread;
these bounds keep each such thread short.
Bundles are never given credentials from the environment: files go in as
written, and `bundle_from_spec` writes `executor.auth` unexpanded.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib

import yaml

from .documents import MAX_BYTES, MAX_DEPTH, dump_yaml, read_capped, select_document
from .errors import SpecError
from .spec import AgentSpec, build_spec

_MiB = MAX_BYTES // (1024 * 1024)
MAX_MEMBERS = 1000        # files, dirs and links in one bundle (an agent dir has a handful)
MAX_YAML_EVENTS = 20_000  # YAML parser events in the spec document (a real spec has hundreds)


def bundle_bytes(path: str | os.PathLike) -> bytes:
    """Bytes to upload for `path`.

    A .yaml/.yml file: a tar.gz holding it at the root under its own name.
    A directory: a tar.gz of its contents, relative to it. Any other file
    (e.g. an existing .tar.gz): its bytes unchanged.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        return _tar_gz(lambda tar: _add_dir(tar, p))
    if not os.path.exists(p):
        raise SpecError(p, "no such file")
    if p.lower().endswith((".yaml", ".yml")):
        data = read_capped(p)
        mtime = int(os.stat(p).st_mtime)
        return _tar_gz(lambda tar: _add_bytes(tar, os.path.basename(p), data, mtime))
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError as e:
        raise SpecError(p, f"cannot read ({e.strerror or e})") from e


def bundle_from_spec(spec: AgentSpec) -> bytes:
    """A tar.gz with one `agent.yaml` holding the effective spec (overrides applied).

    Deterministic bytes for the same spec.
    """
    data = dump_yaml(spec.raw)
    return _tar_gz(lambda tar: _add_bytes(tar, "agent.yaml", data, 0))


def spec_from_bundle(data: bytes, *, name_hint: str = "bundle") -> AgentSpec:
    """The spec inside a bundle: root `config.yaml`, else the single root agent YAML.

    `name_hint` labels errors (`<hint>/<member>: ...`).
    """
    doc, source = bundle_document(data, name_hint)
    return build_spec(doc, source)


def bundle_document(data: bytes, hint: str) -> tuple[object, str]:
    """Parsed spec document of a bundle and its source label; see `spec_from_bundle`."""
    if len(data) > MAX_BYTES:
        raise SpecError(hint, f"bundle too large (over {_MiB} MiB)")
    if bytes(data[:2]) == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(MAX_BYTES + 1)  # bounded: no gzip bombs
        except (OSError, EOFError, zlib.error) as e:
            raise SpecError(hint, f"not a valid .tar.gz bundle ({e})") from e
        if len(data) > MAX_BYTES:
            raise SpecError(hint, f"bundle too large (over {_MiB} MiB unpacked)")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            root = {}
            for count, member in enumerate(tar, 1):  # lazily: stop at the bound, not after it
                if count > MAX_MEMBERS:
                    raise SpecError(hint, f"bundle has over {MAX_MEMBERS} members")
                name = _safe_name(member, hint)
                if member.isfile() and "/" not in name:
                    root[name] = member
            return select_document(
                hint,
                sorted(root),
                lambda n: _bounded_yaml(_member_bytes(tar, root[n]), f"{hint}/{n}"),
                lambda n: f"{hint}/{n}",
            )
    except tarfile.TarError as e:
        raise SpecError(hint, f"not a valid .tar.gz bundle ({e})") from e


def _bounded_yaml(data: bytes, source: str) -> bytes:
    """`data` unchanged if it parses in at most MAX_YAML_EVENTS events, nested at most MAX_DEPTH.

    Scanning events costs a fraction of composing the document and stops at
    the bound. Depth is bounded here too because libyaml rechecks every open
    flow level on each token: a run of 100,000 '[' took 3 s before its 20,000th
    event. Malformed YAML passes here and gets its error from the parse.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    try:
        for count, event in enumerate(yaml.parse(data, Loader=loader), 1):
            if count > MAX_YAML_EVENTS:
                raise SpecError(source, f"too complex (over {MAX_YAML_EVENTS} YAML events)")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise SpecError(source, f"nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError, ValueError):
        pass
    return data


def _safe_name(member: tarfile.TarInfo, hint: str) -> str:
    """Member name without leading './'; absolute or '..' paths (or link targets) are refused."""
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    targets = [member.name]
    if member.issym() or member.islnk():
        targets.append(member.linkname)
    for t in targets:
        t = t.replace("\\", "/")
        if t.startswith("/") or t[1:2] == ":" or ".." in t.split("/"):
            raise SpecError(hint, f"unsafe path in bundle: {t!r}")
    return name


def _tar_gz(fill) -> bytes:
    buf = io.BytesIO()
    # gzip mtime pinned to 0 so identical content gives identical bytes
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        fill(tar)
    return buf.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = mtime
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, root: str) -> None:
    try:
        names = sorted(os.listdir(root))
    except OSError as e:
        raise SpecError(root, f"cannot read ({e.strerror or e})") from e
    for n in names:
        tar.add(os.path.join(root, n), arcname=n, filter=_anonymous)


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # the local user's names and ids have no business on the server
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)  # None only for members that are not regular files
    if f is None:
        raise tarfile.TarError(f"{member.name} is not a regular file")
    return f.read()
