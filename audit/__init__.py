"""The audit log: who changed what, when, through the API or the admin (docs/security.md)."""
