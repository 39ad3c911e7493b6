"""How the members of a tree reach each other and prove who they are.

`memory` is the host<->server link as trio channels of protocol frames
(one process; across processes the same frames go over a websocket), and
`runner_secrets` mints and checks the secret each runner presents. Both
the server and the host import these, so this package imports neither,
nor anything heavy. Kept empty on purpose.
"""
