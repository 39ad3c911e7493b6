"""The runner: a child process that dials the server and executes turns.

`python -m omnigent.runner` (see `main`). Kept empty on purpose: the runner's
startup time is a product target, so importing the package costs nothing and
openai is imported only once the server has acknowledged the hello.
"""
