"""`python -m omnigent` is the `omnigent` command."""

from .cli import main

main()
