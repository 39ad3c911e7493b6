"""How `chat-0.1.0.db` was made: the store of release 0.1.0 (commit 2fe0c5e), before any
later migration, with 100 conversations of two agents in the shapes that release wrote.

Kept for the record; the .db next to it is checked in and must never be regenerated with a
newer omnigent (that would defeat the upgrade tests). Run from a checkout of 2fe0c5e:

    python tests/resources/stores/make_chat_0_1_0.py tests/resources/stores/chat-0.1.0.db
"""

import sys

from omnigent.store import Store


def main(path: str) -> None:
    clock = iter(1_780_000_000.0 + i for i in range(1_000_000))
    with Store(path, clock=lambda: next(clock)) as store:
        agents = [
            store.upsert_agent("legacy-agents", {"name": "legacy-agents", "harness": "openai-agents",
                                                 "model": "mock-model", "instructions": "Reply briefly."}),
            store.upsert_agent("legacy-chat", {"name": "legacy-chat", "harness": "openai-chat",
                                               "model": "mock-model", "instructions": "Reply briefly."}),
        ]
        for n in range(100):
            agent = agents[n % 2]
            conv = store.create_conversation(agent_id=agent["id"], workspace="/tmp/legacy-workspace")
            for t in range(2):
                user = store.append_item(conv["id"], {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"legacy question {n}.{t}"}]})
                turn = store.create_turn(conv["id"], user["id"], owner_pid=1)
                store.start_turn(turn["id"], "runner_" + "0" * 32, owner_pid=1)
                if n % 10 == 9 and t == 1:  # some conversations end in a failed turn
                    store.finish_turn(turn["id"], "failed", error="Error code: 500 - mock failure")
                    continue
                # 0.1.0 stored Responses output items with the endpoint's id, plus its own columns
                output = [{"id": f"msg_{n:04d}{t}", "type": "message", "role": "assistant",
                           "status": "completed", "content": [
                               {"type": "output_text", "text": f"legacy answer {n}.{t}", "annotations": []}]}]
                store.append_turn_output(conv["id"], turn["id"], output, f"resp_{n:04d}{t}")
                store.finish_turn(turn["id"], "completed")
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


if __name__ == "__main__":
    main(sys.argv[1])
