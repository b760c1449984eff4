"""Config groups shipped with mmt, on every Hydra app's search path once mmt is installed (``mmt://mmt.conf``):
``machine/`` (the machine catalogue, Lightning's names); each backend's ``cluster/<name>.yaml`` is in its own
package (``mmt.backends.<name>.conf``). An app's own ``conf/machine/*.yaml`` and ``conf/cluster/*.yaml`` come
first: they override or extend these."""
