"""I/O shells: one module per backend behind one protocol (``base.py``), and the HTTP client
they share."""
