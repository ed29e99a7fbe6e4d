"""Notifications and deliveries: their rows, their one status writer, their day partitions and archive."""
