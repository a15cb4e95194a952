"""Reading answers: validating a read's logprobs, softmax over the controls, the answer records and
their JSON, what a probe learns, a chat server's top_logprobs, the read cache's keys and values,
a batch's records.
"""
