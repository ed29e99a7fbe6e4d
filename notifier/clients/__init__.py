"""API clients: the calling services, their keys, scopes and rate limits."""
