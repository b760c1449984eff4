"""Tuned micro-batch tables of mmt's recipes (``batch.table: pkg://recipes.tuned/<recipe>.yaml``)."""
