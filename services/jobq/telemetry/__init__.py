"""What jobq tells about itself: logs (with the running job's context),
Prometheus metrics, OpenTelemetry spans."""
