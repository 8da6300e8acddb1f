"""Ids the service issues: a kind prefix and 128 random bits, so they cannot be guessed."""

import secrets


def new_id(prefix: str) -> str:
    """A fresh unguessable id such as `cit_3q2...`."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"
