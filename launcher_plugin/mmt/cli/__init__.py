"""The ``mmt`` command line (a console script installed with the package)."""
