"""The `agents` table: one row per agent name, holding its spec and bundle.

Guarantees: an agent keeps its id for good (updated in place, never
deleted and recreated), because conversations reference it; `spec` comes
back decoded.
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
