"""The session's internals: the Session facade, how it is built and configured, planning, judging,
batches, coalescing, generating, its read slots and deadlines, content-free priors, the read
cache, images.
"""
