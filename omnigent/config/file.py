"""The user's config file: defaults for `omnigent run`, read once per command.

`$OMNIGENT_CONFIG_HOME/config.yaml`, else `~/.omnigent/config.yaml`. It holds
defaults, never state and never secrets:

- `model`, `harness`: used when neither a flag, the environment
  (`OMNIGENT_MODEL`, `OMNIGENT_HARNESS`) nor the agent file says (the ladder
  is `agents.load.pick`);
- `permissions`: a ceiling, not a default: a run's tools never do more than
  it allows, whatever the agent file or `--permission-mode` say;
- `default_agent`: the agent of a bare `omnigent run`;
- `server`: the `--server` of a run that names none.

Other tools and older releases write other sections here (`tui:`, `host:`,
an `auth:` block without a key): they are ignored, and kept when `omnigent
config set` rewrites the file. `auth` is read for one thing only, a key
reference that fills in `OPENAI_API_KEY` when the environment has none
(`Config.auth_fallback`); an `auth` without `api_key` changes nothing.

A file that cannot be used (bad YAML, not a mapping, a known key of the
wrong type or value) is a `ConfigError` naming the file, one line. Like the
rest of `omnigent.config`, this imports nothing else of omnigent; yaml is
imported when a file is actually read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dirs import FILE_MODE, home_dir, private_dir

ENV_VAR = "OMNIGENT_CONFIG_HOME"
FILE_NAME = "config.yaml"
# The same lists as `omnigent.agents.HARNESSES` and `omnigent.tools.policy.MODES` (this layer
# may not import them; tests/unit/test_config_file.py checks they agree).
HARNESSES = ("openai-agents", "openai-chat")
PERMISSIONS = ("deny", "ask", "auto")
KEYS = ("model", "harness", "permissions", "default_agent", "server")
# The variables that override agent files (and so the config file) for these keys.
ENV_OVERRIDES = {"model": "OMNIGENT_MODEL", "harness": "OMNIGENT_HARNESS"}
# Keys other tools or releases write here: known, so they are not reported as unknown.
_IGNORED = ("auth",)
_SECRET_RE = re.compile(r"(^|[._-])(auth|api_?key|token|secret|password|credentials?)($|[._-])", re.I)
_MAX_BYTES = 1024 * 1024


class ConfigError(Exception):
    """The config file cannot be used: `<path>: <problem>`, one line."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path, self.problem = str(path), " ".join(problem.split())
        super().__init__(f"{self.path}: {self.problem}")


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$OMNIGENT_CONFIG_HOME`, else `$HOME/.omnigent`."""
    env = os.environ if environ is None else environ
    configured = env.get(ENV_VAR)
    return Path(configured).expanduser() if configured else home_dir()


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    return config_dir(environ) / FILE_NAME


@dataclass(frozen=True)
class Config:
    """The checked defaults of one config file (a missing file is an empty Config).

    Every key is a `str | None`; `default_agent` is absolute (a relative path
    in the file is relative to the file's directory). `raw` is the whole
    document as read, unknown sections included.
    """

    path: Path
    model: str | None = None
    harness: str | None = None
    permissions: str | None = None
    default_agent: str | None = None
    server: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def get(self, key: str) -> str | None:
        """The value of one of KEYS (KeyError for any other key)."""
        if key not in KEYS:
            raise KeyError(key)
        value: str | None = getattr(self, key)
        return value

    @property
    def exists(self) -> bool:
        return self.path.exists()

    def auth_fallback(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`OPENAI_*` variables the `auth:` block supplies where `environ` has none.

        Only an `auth` with an `api_key` counts (the seeds write `auth: {type:
        api_key}`, which must change nothing), and never over a variable that
        is set: the environment always wins. `${VAR}` references are expanded
        from `environ`; one that is not set makes the block count as absent.
        """
        auth = self.raw.get("auth")
        if not isinstance(auth, dict) or not isinstance(auth.get("api_key"), str) or not auth["api_key"]:
            return {}
        if environ.get("OPENAI_API_KEY"):
            return {}
        out: dict[str, str] = {}
        for key, var in (("api_key", "OPENAI_API_KEY"), ("base_url", "OPENAI_BASE_URL")):
            value = auth.get(key)
            if not isinstance(value, str) or not value or environ.get(var):
                continue
            expanded = _expand(value, environ)
            if expanded is None:
                if key == "api_key":
                    return {}
                continue
            out[var] = expanded
        return out


def load_config(*, warn: Callable[[str], None] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Read and check the config file (see the module doc); raises ConfigError.

    `warn` gets at most one line, naming the sections this release ignores.
    """
    path = config_path(environ)
    doc = read_document(path)
    unknown = [k for k in doc if k not in KEYS and k not in _IGNORED]
    if unknown and warn is not None:
        warn(f"{path}: ignoring unknown section{'s' if len(unknown) > 1 else ''}: "
             f"{', '.join(map(str, unknown))}")
    values: dict[str, str | None] = {}
    for key in KEYS:
        if doc.get(key) is not None:
            try:
                values[key] = check_value(key, doc[key], base=path.parent)
            except ValueError as exc:
                raise ConfigError(path, f"{key}: {exc}") from None
    auth = doc.get("auth")
    if auth is not None and not isinstance(auth, dict):
        raise ConfigError(path, f"auth: must be a mapping, got {_kind(auth)}")
    return Config(path=path, raw=doc, **values)


def read_document(path: Path) -> dict[str, Any]:
    """The file's top-level mapping ({} when the file is missing or empty)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(path, f"cannot read ({exc.strerror or exc})") from None
    if len(data) > _MAX_BYTES:
        raise ConfigError(path, "too large (over 1 MiB)")
    import yaml

    try:
        doc = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, f"not valid YAML{where}: {problem}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(path, f"not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(path, f"the top level must be a mapping of settings, got {_kind(doc)}")
    return doc


def check_value(key: str, value: object, *, base: Path | None = None) -> str:
    """`value` checked for `key` (ValueError with the problem); default_agent made absolute."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {_kind(value)}")
    value = value.strip()
    if not value:
        raise ValueError("must not be empty")
    if key == "harness" and value not in HARNESSES:
        raise ValueError(f"unknown harness {value!r} (known: {', '.join(HARNESSES)})")
    if key == "permissions" and value not in PERMISSIONS:
        raise ValueError(f"unknown mode {value!r} (known: {', '.join(PERMISSIONS)})")
    if key == "server":
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://HOST[:PORT] URL, not {value!r}")
        value = value.rstrip("/")
    if key == "default_agent":
        p = Path(value).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        value = str(p)
    return value


def is_secret(key: str) -> bool:
    """A key whose value would be a credential (refused by `omnigent config set`)."""
    return bool(_SECRET_RE.search(key))


def set_value(path: Path, key: str, value: str | None) -> None:
    """Write `key: value` (or remove `key` when None) into the file at `path`, atomically.

    Everything else in the file is kept byte for byte where possible (comments,
    unknown sections such as `tui:`); the directory is made 0700 and the file
    is 0600. Raises ConfigError (the existing file is unusable, or the write failed).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    doc = read_document(path)
    wanted = dict(doc)
    if value is None:
        wanted.pop(key, None)
    else:
        wanted[key] = value
    new_text = _edit_text(text, key, value)
    if new_text is None or _parse(new_text) != wanted:
        import yaml  # the text could not be edited in place: write the document as a whole

        new_text = yaml.safe_dump(wanted, sort_keys=False, allow_unicode=True, default_flow_style=False)
    _write_atomic(path, new_text)


def _edit_text(text: str, key: str, value: str | None) -> str | None:
    """`text` with the top-level `key` line(s) replaced (or appended, or removed); None if unsure."""
    import yaml

    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(key)}\s*:", line)), None)
    new: list[str] = []
    if value is not None:
        line = yaml.safe_dump({key: value}, allow_unicode=True, width=1 << 20)
        if line.count("\n") != 1:
            return None
        new = [line]
    if start is None:
        if value is None:
            return text
        if text and not text.endswith("\n"):
            text += "\n"
        return text + new[0]
    end = start + 1
    while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # blank lines after the value belong to what follows
    return "".join(lines[:start] + new + lines[end:])


def _parse(text: str) -> object:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return {} if doc is None else doc


def _write_atomic(path: Path, text: str) -> None:
    private_dir(path.parent, "cannot create config directory")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigError(path, f"cannot write ({exc.strerror or exc})") from None


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: str, environ: Mapping[str, str]) -> str | None:
    missing = [m.group(1) for m in _VAR_RE.finditer(value) if m.group(1) not in environ]
    if missing:
        return None
    return _VAR_RE.sub(lambda m: environ[m.group(1)], value)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
