"""The functional core: questions, controls, prompt framing, validation, softmax, answers.

Nothing here does I/O or imports a backend; an import-linter contract in pyproject.toml
enforces it.
"""
