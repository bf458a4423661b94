"""``mrcnn-bench``: the only room that reads argv; each command takes typed options from the rooms below it.

May import: every other room.
"""
