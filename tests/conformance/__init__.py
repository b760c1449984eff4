"""Conformance tier: Hydra's own launcher and sweeper test suites, run against mmt's backends."""
