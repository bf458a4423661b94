"""``python -m mrcnn.export``: the same command as ``mrcnn export``."""

from mrcnn.export.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
