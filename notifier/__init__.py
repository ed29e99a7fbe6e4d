"""The core of Notifier: API clients, notifications, deliveries, dedup, fan-out, campaigns, dead letters."""
