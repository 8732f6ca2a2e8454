"""Operating serve_app: the CLI, starting a local cluster, and rendering status."""
