"""Integrations with frameworks (issue #50): ``jobq.contrib.django``."""
