"""The chief's side: hand the step over, and let threads write it to Redis (its modules:
docs/design.md#package-layout).
"""
