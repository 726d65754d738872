"""Helpers shared by the tests: one stack builder, one CLI runner, one sandbox fixture, the checkout path."""
