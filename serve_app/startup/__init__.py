"""A replica's start-up: the phased pipeline, warm workers, and every private Ray API behind
one module."""
