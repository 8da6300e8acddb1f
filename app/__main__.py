"""`python -m app` is the `grounding` command."""

from app.cli import main

main()
