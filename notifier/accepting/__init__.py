"""Accepting a send: validation, policy, dedup and the accept itself, grouped into few commits."""
