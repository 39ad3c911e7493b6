"""The single error a peer's bad frame turns into, with the close code to use."""


class ProtocolError(Exception):
    """A frame or event that must not be accepted.

    `close_code` is the websocket close code the receiving side should use:
    4000 malformed, 4002 protocol version, 4009 frame too large.
    """

    MALFORMED = 4000
    VERSION = 4002
    TOO_LARGE = 4009

    def __init__(self, reason: str, close_code: int = MALFORMED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.close_code = close_code
