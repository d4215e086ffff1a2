"""The shared runtime: the lowest room, imported by every role and by no role above it."""
