"""Idempotency keys: a retried write answered with its first response, written once."""
