"""Schema-bound generation: the request, the server's output, the JSON Schema checks."""
