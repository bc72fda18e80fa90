"""What an application imports to publish: the client (async and sync), typed
task handles, workflows, results, and the publish-then-mark path."""
