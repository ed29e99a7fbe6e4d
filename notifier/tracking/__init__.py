"""Open and click tracking for email: signed redirects and an open pixel under /t/."""
