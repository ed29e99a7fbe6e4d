"""Recipients, devices, preferences, quiet hours, topics, subscriptions and the suppression list."""
