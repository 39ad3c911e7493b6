"""Entry point for `python -m omnigent.runner`: the supervisor launches this."""

import os
import sys

from omnigent.runner.main import main

code = main()
# Everything is closed by now; skipping interpreter teardown (~0.2 s with
# openai and pydantic loaded) lets the supervisor see the exit at once.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
