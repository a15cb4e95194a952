"""The wire protocols the SDK speaks and serves (System One, OpenAI Decisions), their JSON values
and the decode budget a server reads them under.
"""
