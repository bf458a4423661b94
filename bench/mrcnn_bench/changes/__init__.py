"""Changes in the history: asv's results read into series, change points (Apache Otava in its own
environment), ``mrcnn-bench steps``, asv's own flags, and the regression report with each block's confirm command.

May import: ``base``, ``running``, ``gates``, ``history``, ``publish``.
"""
