"""Gateway: the overhead and the load of ``typevet-async serve`` (System One and Decisions)
over a direct session."""
