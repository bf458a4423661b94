"""asv's published pages made to load with no network (npm-vendored scripts) and screenshots of them.

May import: ``base``.
"""
