"""An app's settings are its task clients' settings (found as a flaky
test_tasks under load: settings set on an app after it was made did not
reach the clients its tasks open, which then published into the
environment's namespace while the consumer read another)."""

from __future__ import annotations

import jobq
from jobq.settings import Settings


def test_settings_set_on_an_app_reach_the_clients_its_tasks_open() -> None:
    app = jobq.App()
    assert app.settings is None and app.clients.settings is None
    mine = Settings(namespace="mine")
    app.settings = mine
    assert app.clients.settings is mine
    assert jobq.App(mine).clients.settings is mine
