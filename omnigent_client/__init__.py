"""omnigent_client: the public async SDK of an omnigent server.

    from omnigent_client import OmnigentClient, SessionsChat

    async with OmnigentClient("http://127.0.0.1:8123") as client:
        session = await client.sessions.create(bundle, reasoning_effort="high")
        chat = SessionsChat(namespace=client.sessions, session=session)
        print((await chat.query("hello")).text)

It runs on httpx and anyio, so under trio and under asyncio alike, and
importing it loads no server code (no quart, hypercorn, openai, sqlite_utils,
nor trio). The code lives in `omnigent.client`; this package re-exports its
public names.
"""

from omnigent.client import *  # noqa: F403
from omnigent.client import __all__  # noqa: F401
