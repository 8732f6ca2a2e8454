"""Test doubles (scripted NVML, a logical GPU partition, fault hooks). Production code imports
this package only when a test switches a double on (serve_app.env)."""
