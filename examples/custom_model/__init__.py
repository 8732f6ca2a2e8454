"""A user model served by serve_app: see README.md here."""
