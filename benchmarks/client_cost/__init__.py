"""Client cost: what the SDK client itself costs per question (CPU, memory, event-loop lag,
tracing, the read it sends), against a server that replays real recorded llama.cpp bodies or
against the clients people use."""
