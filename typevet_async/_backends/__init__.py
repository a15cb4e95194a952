"""I/O shells: one module per backend, and the HTTP client they share."""
