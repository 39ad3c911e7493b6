"""`omnigent run AGENT -r` without an id: choose one of the agent's recent conversations.

On a terminal the user answers with a number or an id; Ctrl-D leaves (exit
1), and so does Ctrl-C, as the KeyboardInterrupt the front end turns into
exit 130 (`LineInput.read(interrupt=True)`). From a pipe there is nobody to
ask, so the list is printed with an error asking for an id. Titles (names)
are shown, aligned by display width (`table`).
"""

from __future__ import annotations

import sys
import time

from ..client import OmnigentClient, OmnigentError
from .render import picker_list
from .terminal import LineInput

QUESTION = "Resume which one? (number or id) "


class PickError(Exception):
    """Nothing was picked: printed as `Error: <message>`, exit 1."""


async def pick_session(client: OmnigentClient, agent_name: str, lines: LineInput) -> str:
    rows = await client.list_sessions(agent_name=agent_name, limit=20, sort_by="updated_at")
    if not rows:
        raise PickError(f"No prior conversation for agent {agent_name!r}.")
    listing = picker_list(rows, time.time())
    if not lines.interactive:
        print(f"Recent conversations of {agent_name}:\n{listing}", file=sys.stderr, end="", flush=True)
        raise PickError("stdin is not a terminal, so there is nobody to pick: "
                        "pass the conversation id, as in --resume <id>.")
    print(f"Recent conversations of {agent_name}:\n{listing}", end="", flush=True)
    while True:
        try:
            answer = (await lines.read(QUESTION, remember=False, interrupt=True)).strip()
        except EOFError:
            raise PickError("No conversation picked.") from None
        if answer.isdigit() and 1 <= int(answer) <= len(rows):
            return rows[int(answer) - 1]["id"]
        if answer:
            try:
                return (await client.get_session(answer))["id"]
            except OmnigentError as exc:
                if exc.status_code != 404:
                    raise
        print(f"Type a number from 1 to {len(rows)}, or a conversation id.", flush=True)
