"""Operating serve_app: the CLI (cli), starting a local cluster (launch) with the environment
every node needs (cluster_env), its ports (ports) and Serve's HAProxy (haproxy), and rendering
status (status)."""
