"""`/permissions` and `/usage`: what this session allows for good, and what it has cost.

`/permissions` lists the session's "always" rules (a tool with one exact
command, or one path), numbered; `/permissions revoke N` removes rule N, so
the next such call is asked again. `/usage` sums the tokens of the
session's turns, as the server stores them per turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import api
from .output import usage_of
from .steps import clip

if TYPE_CHECKING:
    from ..client import OmnigentClient
    from .render import Console


def _rule(rule: dict) -> str:
    return f"{clip(str(rule.get('tool')), 40)}: {clip(str(rule.get('target') or ''), 100)}"


async def permissions_command(client: OmnigentClient, console: Console, session_id: str, arg: str) -> None:
    rules = await api.rules(client, session_id)
    verb, _, number = arg.partition(" ")
    if not verb:
        if not rules:
            console.line('  No "always" approvals in this session.')
            return
        for n, rule in enumerate(rules, 1):
            console.line(f"  {n}. {_rule(rule)}")
        console.line("  /permissions revoke <#> removes one")
        return
    number = number.strip()
    if verb != "revoke" or not number.isdigit():
        console.line("  Usage: /permissions, or /permissions revoke <#>")
        return
    if not 1 <= int(number) <= len(rules):
        console.line(f"  No rule #{number} ({len(rules)} listed).")
        return
    rule = rules[int(number) - 1]
    await api.revoke(client, session_id, str(rule["id"]))
    console.line(f"  Revoked: {_rule(rule)}")


async def usage_command(client: OmnigentClient, console: Console, session_id: str) -> None:
    usage = (await client.get_session(session_id)).get("usage")
    if not isinstance(usage, dict):
        console.line("  No usage recorded for this session.")
        return
    tokens = usage_of(usage)
    turns = usage.get("turns")
    over = f" over {turns} turn{'' if turns == 1 else 's'}" if isinstance(turns, int) else ""
    console.line(f"  This session: {tokens['input_tokens']:,} input + {tokens['output_tokens']:,} output "
                 f"= {tokens['total_tokens']:,} tokens{over}")
