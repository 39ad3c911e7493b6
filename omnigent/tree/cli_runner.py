"""One runner process started by hand, outside any host, for a server elsewhere.

This is what `omnigent.cli._start_cli_runner_process` does (the original's
name and shape, reference §5.2): a client registers an *explicit* runner with
`POST /v1/runners` (the server keeps only a hash of its secret), then launches
`python -m omnigent.runner` with the id and secret in its environment, never
in argv. Explicit runners are never chosen by placement: they serve the
sessions a client binds to them (`PATCH /v1/sessions/{id} {runner_id}`).

What it guarantees:

- The runner's stdin is a pipe the caller holds (`proc.stdin`); the runner
  exits within ~0.1 s of its EOF, so a caller that dies leaves no runner.
- It runs in its own process group, which `stop` signals (TERM, a grace, KILL).
- No client credential reaches it: `OMNIGENT_REMOTE_AUTH_TOKEN` (what this
  client authenticates with) and `OMNIGENT_SERVER_TOKEN` are removed from its
  environment; it has only its own secret.
- With `capture_logs`, its output goes to a 0600 file under `log_dir/runner/`.

Registration is synchronous (httpx), like the callers the seeds have.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

# what the client side authenticates with; never handed to the runner
AUTH_VAR = "OMNIGENT_REMOTE_AUTH_TOKEN"


@dataclass(frozen=True)
class CliRunnerProcess:
    """A started runner: the process, its id, its secret and where its output goes."""

    proc: subprocess.Popen[bytes]
    runner_id: str
    tunnel_token: str
    log_path: Path | None


def register(server_url: str, *, runner_id: str | None, secret: str | None, isolate: bool,
             environ: Mapping[str, str]) -> tuple[str, str]:
    """`POST /v1/runners`: the (runner_id, secret) the server bound; ClickException on any refusal."""
    import httpx

    body: dict[str, object] = {}
    if runner_id is not None:
        body["runner_id"] = runner_id
    if secret is not None:
        body["runner_secret"] = secret
    if isolate:
        body["isolate"] = True
    headers = {"Authorization": f"Bearer {environ[AUTH_VAR]}"} if environ.get(AUTH_VAR) else {}
    try:
        response = httpx.post(f"{server_url}/v1/runners", json=body, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot register a runner with {server_url}: {exc}") from None
    if response.status_code != 201:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text.strip()[:200] or response.reason_phrase
        raise click.ClickException(
            f"{server_url} refused to register the runner ({response.status_code}): {message}")
    data = response.json()
    return data["runner_id"], data["runner_secret"]


def start(*, server_url: str, tunnel_token: str | None = None, runner_id: str | None = None,
          workspace_cwd: Path | str, capture_logs: bool, log_dir: Path | str | None,
          prewarm_spec_path: Path | str | None = None, isolate_session: bool = False,
          extra_env: Mapping[str, str] | None = None) -> CliRunnerProcess:
    """Register a runner with `server_url` and launch it.

    Given `runner_id` and `tunnel_token`, exactly that id and secret are
    registered, or the call fails (409: the id is known). `prewarm_spec_path`
    is accepted for the original's signature: the runner already builds the
    model client its environment's credentials give before its first turn.
    """
    from ..config.dirs import DiskError, private_dir
    from ..config.logs import logs_dir
    from ..host.launching import runner_argv
    from ..link.runner_secrets import CLIENT_TOKEN_VARS, ENV_VAR

    server_url = server_url.rstrip("/")
    rid, secret = register(server_url, runner_id=runner_id, secret=tunnel_token,
                           isolate=isolate_session, environ=os.environ)
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_TOKEN_VARS and k != AUTH_VAR}
    env.update(extra_env or {})
    env.update({"OMNIGENT_SERVER_URL": server_url, "OMNIGENT_RUNNER_ID": rid, ENV_VAR: secret})
    for name in (AUTH_VAR, *CLIENT_TOKEN_VARS):  # not even through extra_env
        env.pop(name, None)

    log_path: Path | None = None
    out = None
    if capture_logs:
        folder = Path(log_dir) if log_dir is not None else logs_dir()
        log_path = folder / "runner" / f"{rid}.log"
        try:
            private_dir(folder / "runner", "cannot create log folder")
            out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except (DiskError, OSError) as exc:
            raise click.ClickException(f"cannot open the runner log: {log_path}: {exc}") from None
    try:
        proc = subprocess.Popen(runner_argv(env), env=env, cwd=str(workspace_cwd), stdin=subprocess.PIPE,
                                stdout=out, stderr=out, start_new_session=True)
    except OSError as exc:
        raise click.ClickException(f"cannot start a runner: {exc}") from None
    finally:
        if out is not None:
            os.close(out)  # the child has its own copy
    return CliRunnerProcess(proc=proc, runner_id=rid, tunnel_token=secret, log_path=log_path)


def stop(proc: subprocess.Popen[bytes], *, grace_timeout: float = 5.0) -> int:
    """Stop a runner started by `start`: stdin EOF and SIGTERM to its group, a grace, then SIGKILL."""
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()  # the runner's own signal to leave
        except OSError:
            pass
    if proc.poll() is not None:
        return proc.returncode  # reaped: its pid (and group id) may belong to someone else now
    _signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)  # not yet reaped, so the group is still its own
        return proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
