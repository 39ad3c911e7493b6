"""The names the seeds import from `tests.e2e.omnigent._pexpect_harness`: the one harness, re-exported."""

from tests.e2e._pexpect_harness import (
    PROMPT_READY,
    STATE_SLEEPING,
    clean_exit,
    ensure_repl_test_theme_env,
    submit_prompt,
)

__all__ = ["PROMPT_READY", "STATE_SLEEPING", "clean_exit", "ensure_repl_test_theme_env", "submit_prompt"]
