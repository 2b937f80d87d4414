"""Checks of the repository's files rather than the library's behaviour.

The README and docs site (pointers, snippets, the built HTML), the packaging,
the package's module layout, the compose files and the ops/ deployment files,
and the test suite's own Hypothesis profiles.
"""
