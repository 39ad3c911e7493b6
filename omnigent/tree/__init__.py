"""What builds a tree: one trio nursery that supervises a server, a host and a front end.

`local.run_tree` is `omnigent run`'s and `omnigent server`'s tree, all in
one process. The top layer: it imports the server, the host and the
configuration; none of them imports it. Kept empty on purpose.
"""
