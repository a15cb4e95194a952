"""Building a prompt: typed questions, their controls and codes, the field block, examples, the
layouts and the served template's framing, neutralised caller text, option rotations, and the
scoring request.
"""
