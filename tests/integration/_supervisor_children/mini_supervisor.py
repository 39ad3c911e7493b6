"""A supervisor process for the orphan test: it supervises one child.py and is then SIGKILLed.

The child's hello goes straight to the test (CHILD_PORT/CHILD_TOKEN are inherited),
so this process needs no ready check of its own.
"""

import sys
from pathlib import Path

import trio

from supervisor import ProcessConfig, Supervisor, process_child

CHILD = Path(__file__).with_name("child.py")


async def main() -> None:
    def prepare() -> ProcessConfig:
        return ProcessConfig([sys.executable, str(CHILD), "normal"], None, None, Path(sys.argv[1]))

    await Supervisor().run([process_child("orphan-to-be", prepare)])


trio.run(main)
