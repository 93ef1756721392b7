"""Talking to the API server: the client, its JSON transport, the fan-out pool, permissions, events."""
