"""grounding-service: auditable citations and fail-closed grounding checks."""
