"""The request path: the model deployment (also the HTTP ingress), routing, auth, OpenAPI,
the batcher, out-of-memory splitting, readiness, poisoned contexts, the report registry and
metrics."""
