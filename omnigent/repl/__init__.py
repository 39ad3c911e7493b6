"""What the user talks to: `omnigent run`'s front end, a client of a server.

`options` is what the CLI resolved (plain data); `front` picks the
conversation and runs one `-p` prompt or hands over to the REPL (`repl`,
with `terminal` input, `render`ed output and the resume `picker`).
Kept empty on purpose: the CLI imports `options` before the tree starts,
and the HTTP client the rest pulls in is imported only once the runner
has been launched (see `omnigent.tree.local.run_tree`'s `make_front`).
"""
