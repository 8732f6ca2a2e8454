"""One-off probes (see README.md here): not packaged, not part of the test command's lint."""
