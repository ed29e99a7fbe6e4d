"""Staff tools: the support actions on one delivery, the staff roles, the admin charts and set-up commands."""
