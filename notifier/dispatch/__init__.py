"""Dispatch: the outbox, topic fan-out, fallback chains, digests, frequency caps and the fan-out pace."""
