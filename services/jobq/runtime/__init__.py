"""What a long-running jobq process shares: its life cycle (start, readiness,
signals, stop) and its health endpoints."""
