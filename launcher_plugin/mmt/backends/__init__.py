"""Where jobs run: one package per backend behind the ``Backend`` interface (``mmt.backends.base``)."""
