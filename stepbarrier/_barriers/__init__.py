"""Named barriers: every party waits until all have arrived (its modules:
docs/design.md#package-layout).
"""
