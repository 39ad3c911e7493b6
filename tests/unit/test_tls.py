"""A plain-HTTP client skips loading the CA bundle, and trusts nothing over TLS instead.

The runner's model client and the SDK's client both take their `verify` from
`config/tls.py`: for an `http://` base URL a context with no CA at all (a
redirect to https then fails verification), for anything else httpx's default.
"""

from __future__ import annotations

import ssl

import pytest

from omnigent.client._http import Transport
from omnigent.config.tls import verify_for
from omnigent.runner.harness import _new_client


def _trusts_nothing(ctx: ssl.SSLContext) -> bool:
    return (ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
            and ctx.cert_store_stats()["x509_ca"] == 0)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8123", "HTTP://localhost/v1"])
def test_a_plain_http_url_gets_a_context_that_verifies_against_no_ca(url):
    ctx = verify_for(url)
    assert isinstance(ctx, ssl.SSLContext) and _trusts_nothing(ctx)


@pytest.mark.parametrize("url", ["https://api.openai.com/v1", None, ""])
def test_any_other_url_keeps_httpxs_verification(url):
    assert verify_for(url) is True


def test_the_runners_model_client_loads_no_ca_bundle_for_a_local_server_only():
    local = _new_client("k", "http://127.0.0.1:9/v1")
    remote = _new_client("k", "https://api.example.com/v1")
    assert _trusts_nothing(local._client._transport._pool._ssl_context)
    assert remote._client._transport._pool._ssl_context.cert_store_stats()["x509_ca"] > 0
    assert local.timeout == remote.timeout and local.max_retries == remote.max_retries
    assert local._client.follow_redirects == remote._client.follow_redirects


def test_the_sdks_client_loads_no_ca_bundle_for_a_local_server_only():
    local = Transport("http://127.0.0.1:9", headers=None, auth=None, timeout=5)
    remote = Transport("https://omnigent.example.com", headers=None, auth=None, timeout=5)
    assert _trusts_nothing(local.http._transport._pool._ssl_context)
    assert remote.http._transport._pool._ssl_context.cert_store_stats()["x509_ca"] > 0
