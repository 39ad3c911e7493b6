"""Omnigent: run AI agents defined in YAML from the terminal.

Kept empty on purpose: `python -m omnigent` and the runner must not pay for
imports they do not use (stack-notes G14).
"""
