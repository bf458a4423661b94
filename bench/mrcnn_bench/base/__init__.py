"""The basics every room may use: the defaults that commands print, the one clock, the usage error,
the one atomic write, the one way to run git, and text from outside made safe to print in a table.

May import: no other room (the standard library, and from the library only what these basics
re-export: its usage error and its atomic write, with a fallback for an older checkout's library).
"""
