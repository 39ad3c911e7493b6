"""The HTTP + websocket API server: sessions, items, runners, event streams."""
