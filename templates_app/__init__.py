"""Versioned, localized templates and their rendering."""
