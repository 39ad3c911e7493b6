"""Agents per session: the spec a session runs is pinned when it is created (issue 8 §2).

On a shared server one client's upload of an agent name must never change
what another session runs; a resume that uploads its bundle (with its
`--model`/`--harness` overrides) changes only its own session; `--continue`
still finds sessions by agent name; the turn a runner gets carries the
pinned spec.
"""

from __future__ import annotations

import json

import httpx
import trio

from omnigent.agents import bundle_bytes

from .test_server_api import fake_runner, server  # noqa: F401


def _bundle(tmp_path, model: str, prompt: str, harness: str = "openai-chat") -> bytes:
    path = tmp_path / f"{model}.yaml"
    path.write_text(f"name: shared_agent\nprompt: {prompt}\nexecutor:\n  harness: {harness}\n  model: {model}\n")
    return bundle_bytes(path)


async def _create(http: httpx.AsyncClient, bundle: bytes) -> str:
    resp = await http.post("/v1/sessions", files={"bundle": ("a.tar.gz", bundle)}, data={"metadata": "{}"})
    assert resp.status_code == 201, resp.text
    return resp.json()["session_id"]


async def test_an_upload_never_changes_another_sessions_spec(server, tmp_path):  # noqa: F811
    async with httpx.AsyncClient(base_url=server.url) as http:
        first = await _create(http, _bundle(tmp_path, "model-a", "first prompt"))
        second = await _create(http, _bundle(tmp_path, "model-b", "second prompt"))
        assert (await http.get(f"/v1/sessions/{first}")).json()["llm_model"] == "model-a"
        assert (await http.get(f"/v1/sessions/{second}")).json()["llm_model"] == "model-b"
        # another client uploads the same agent name (POST /v1/agents): nobody's session changes
        other = await http.post("/v1/agents", files={"bundle": ("a.tar.gz", _bundle(tmp_path, "model-c", "x"))},
                                data={"metadata": "{}"})
        assert other.status_code == 200
        assert (await http.get(f"/v1/sessions/{first}")).json()["llm_model"] == "model-a"
        # a resume with an override pins it to that session only
        resumed = await http.post("/v1/agents", files={"bundle": ("a.tar.gz", _bundle(
            tmp_path, "model-d", "resumed", harness="openai-agents"))},
            data={"metadata": json.dumps({"session_id": first})})
        assert resumed.status_code == 200 and resumed.json()["session_id"] == first
        body = (await http.get(f"/v1/sessions/{first}")).json()
        assert (body["llm_model"], body["harness"]) == ("model-d", "openai-agents")
        assert (await http.get(f"/v1/sessions/{second}")).json()["llm_model"] == "model-b"
        # --continue still matches by name: both sessions are the agent's
        listed = (await http.get("/v1/sessions", params={"agent_name": "shared_agent"})).json()["data"]
        assert {row["id"] for row in listed} == {first, second}
        bad = await http.post("/v1/agents", files={"bundle": ("a.tar.gz", _bundle(tmp_path, "m", "p"))},
                              data={"metadata": json.dumps({"session_id": "conv_nope"})})
        assert bad.status_code == 404


async def test_a_turn_runs_with_the_sessions_pinned_spec(server, tmp_path):  # noqa: F811
    async with httpx.AsyncClient(base_url=server.url) as http, fake_runner(server) as seen:
        sid = await _create(http, _bundle(tmp_path, "model-a", "pinned prompt"))
        await http.post("/v1/agents", files={"bundle": ("a.tar.gz", _bundle(tmp_path, "model-z", "other"))},
                        data={"metadata": "{}"})
        posted = await http.post(f"/v1/sessions/{sid}/events",
                                 json={"type": "message", "data": {"role": "user", "content": "hi"}})
        assert posted.status_code == 202
        with trio.fail_after(10):
            while not seen["turns"]:
                await trio.sleep(0.01)
        [turn] = seen["turns"]
        assert (turn.model, turn.agent["instructions"]) == ("model-a", "pinned prompt")
        assert turn.generation == 1  # the session was bound to the runner once
