"""`omnigent sessions`: find, read, export, name, fork and remove conversations.

`commands` is the click group (it imports only click, so `omnigent --help`
stays instant) and picks where the commands act: the local store file
directly (`local`: no server, no runner, no trio) or a server through the
SDK (`remote`, with `--server`), both behind `backend.Catalog`. `export`
and `listing` turn what they return into text, the same for both.
"""
