"""Agents: one named row per agent name, and the spec each session is pinned to.

The `agents` table has one row per name, holding the latest upload of that
name: new sessions start from it and `--continue` finds sessions by it. An
agent keeps its id for good (updated in place, never deleted and
recreated), because conversations reference it; `spec` comes back decoded.

What a session *runs* is its own copy (`session_agents`, migration
0006_ownership), pinned when the session is created and changed only for
that session (a resume uploading its bundle, `--model`/`--harness`), so on a
shared server one client's upload never rewrites another session's prompt or
model. A session of an older release without a pinned row reads the named
row (`session_spec`) until something pins it.
"""

from __future__ import annotations

import json

from . import ids
from ._base import Tables, _agent


class AgentsMixin(Tables):
    def upsert_agent(self, name: str, spec: dict, bundle: bytes | None = None) -> dict:
        """Create the agent `name`, or update its spec and bundle in place.

        Never delete-and-recreate: conversations reference the agent's id.
        """
        if not name:
            raise ValueError("agent name must not be empty")
        spec_json = json.dumps(spec)
        with self._write():
            now = self._clock()
            agent_id = self._scalar("SELECT id FROM agents WHERE name = ?", [name])
            if agent_id is None:
                agent_id = ids.new_id(ids.AGENT)
                self.db.execute(
                    "INSERT INTO agents (id, name, spec, bundle, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    [agent_id, name, spec_json, bundle, now, now],
                )
            else:
                self.db.execute(
                    "UPDATE agents SET spec = ?, bundle = ?, updated_at = ? WHERE id = ?",
                    [spec_json, bundle, now, agent_id],
                )
        return self.get_agent(agent_id)  # type: ignore[return-value]

    def get_agent(self, agent_id: str) -> dict | None:
        return _agent(self._one("SELECT * FROM agents WHERE id = ?", [agent_id]))

    def get_agent_by_name(self, name: str) -> dict | None:
        return _agent(self._one("SELECT * FROM agents WHERE name = ?", [name]))

    # --- the spec a session runs with ---------------------------------------

    def pin_session_agent(self, conv_id: str, spec: dict, bundle: bytes | None = None) -> None:
        """Pin (or re-pin) the spec this one session runs with; no other session sees it."""
        with self._write():
            self._require_conversation(conv_id)
            self.db.execute(
                """INSERT INTO session_agents (conversation_id, spec, bundle, updated_at) VALUES (?, ?, ?, ?)
                   ON CONFLICT (conversation_id) DO UPDATE
                   SET spec = excluded.spec, bundle = excluded.bundle, updated_at = excluded.updated_at""",
                [conv_id, json.dumps(spec), bundle, self._clock()],
            )

    def session_spec(self, conv_id: str) -> dict:
        """The spec the session runs with: its pinned one, else (older sessions) its named agent's."""
        row = self._one(
            """SELECT COALESCE(s.spec, a.spec) AS spec FROM conversations c
               LEFT JOIN session_agents s ON s.conversation_id = c.id
               LEFT JOIN agents a ON a.id = c.agent_id WHERE c.id = ?""", [conv_id])
        return json.loads(row["spec"]) if row and row["spec"] else {}
