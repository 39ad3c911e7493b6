"""Runner secrets: minted by whoever launches a runner, checked by the server.

Every runner process gets its own secret, bound to its runner id. The secret
travels only in the runner's environment (`OMNIGENT_RUNNER_TOKEN`), never in
argv, logs or the store; the server keeps just its sha256. Secrets are 32
random bytes, so a plain hash is as strong as a slow one and costs nothing
per connection. Kept apart from the server so a host never imports it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

ENV_VAR = "OMNIGENT_RUNNER_TOKEN"
# what a runner's environment never inherits from its launcher: other roles' credentials
CLIENT_TOKEN_VARS = ("OMNIGENT_SERVER_TOKEN",)


def mint_secret() -> str:
    return secrets.token_urlsafe(32)


def mint_runner_id() -> str:
    return f"runner_{secrets.token_hex(16)}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str | None, secret_hash: str) -> bool:
    """Constant-time check of a presented secret against a stored hash."""
    if not secret:
        return False
    return hmac.compare_digest(hash_secret(secret).encode(), secret_hash.encode())


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None if there is none."""
    if not authorization or not authorization.startswith("Bearer "):
        return None
    return authorization[7:] or None
