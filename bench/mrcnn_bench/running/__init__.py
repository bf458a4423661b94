"""Running cases: what to run (cases), how each compiler builds it (pipelines), timing rows in this process
or a worker, the probes and the machine's ceiling, and the typed records, journal and run files a run writes.

May import: ``base``.
"""
