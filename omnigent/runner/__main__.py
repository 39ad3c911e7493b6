"""Entry point for `python -m omnigent.runner`: the supervisor launches this."""

import os
import sys

from omnigent.config.timeline import mark

mark("runner.start")

from omnigent.runner import _early_exit  # noqa: E402

_early_exit.arm()  # before the imports below: the parent may die while they run

from omnigent.runner.main import main  # noqa: E402

code = main()
# Everything is closed by now; skipping interpreter teardown (~0.2 s with
# openai and pydantic loaded) lets the supervisor see the exit at once.
sys.stdout.flush()
sys.stderr.flush()
mark("runner.exit")
os._exit(code)
