"""Examples of serve_app in use (not packaged: run them from the repository root)."""
