"""Channel workers: the send tasks, provider adapters, rate limits and circuit breakers."""
