"""The applications over the public API: the command line, the System One gateway, the MCP server,
evaluation and its report, Ray, the demo.
"""
