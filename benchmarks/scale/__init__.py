"""Scale: throughput when the servers are the bottleneck: fleets, Ray, long load runs, prefix
reuse, the read cache and parallel generation."""
