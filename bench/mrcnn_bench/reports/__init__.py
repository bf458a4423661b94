"""Reports of runs: tables and plots of one or more run files, the dashboard of many, each run's notes, and
records for PyTorch's benchmark database.

May import: ``base``, ``running``, ``gates``.
"""
