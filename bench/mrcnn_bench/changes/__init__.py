"""Changes in the history: asv's results read (and checked) into series, change points (Apache Otava in
its own environment), ``mrcnn-bench steps`` and ``bisect``, asv's own flags, the work counters' exact
steps, and the regression report with each block's confirm command (run live on request).

May import: ``base``, ``running``, ``gates``, ``history``, ``publish``.
"""
