"""An explicit-state model of the barrier protocol (docs/protocol.md), checked exhaustively."""
