"""Django's PostgreSQL backend with a health check that asks the server only when the socket says something."""
