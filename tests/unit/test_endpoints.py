"""Connection strings naming several servers (issue #15): checked host by
host, shown without credentials."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobq.endpoints import hosts, redact, split_amqp
from jobq.settings import Settings


def test_several_broker_urls_and_database_hosts_are_accepted() -> None:
    s = Settings(amqp_url="amqp://u:p@r1:5672/v, amqp://u:p@r2:5673/v,amqps://u:p@r3/v",
                 database_url="postgresql://u:pw@db1:5432,db2:5433/jobq"
                              "?target_session_attrs=read-write")
    assert split_amqp(s.amqp_url) == ["amqp://u:p@r1:5672/v", "amqp://u:p@r2:5673/v",
                                      "amqps://u:p@r3/v"]
    assert hosts(s.database_url) == [("db1", 5432), ("db2", 5433)]
    assert hosts("postgresql://u@[::1]:5432,h/x") == [("::1", 5432), ("h", None)]


@pytest.mark.parametrize("field,value", [
    ("amqp_url", "amqp://u:p@r1:5672/,amqp://u:p@r2:99999/"),
    ("amqp_url", "amqp://u:p@r1/,http://r2/"),
    ("amqp_url", "amqp://u:p@r1:5672,r2:5672/"),  # libpq's form is for the database only
    ("database_url", "postgresql://u@db1:5432,db2:nope/jobq"),
])
def test_a_bad_entry_anywhere_in_a_list_is_refused(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings.model_validate({field: value})
    assert "secret" not in str(err.value)


def test_redact_names_every_server_and_no_credentials() -> None:
    assert redact("amqp://u:secret@r1:5672/v,amqp://u:secret@r2/v") == "r1:5672/v,r2/v"
    assert redact("postgresql://u:secret@db1:5432,db2:5433/jobq") == "db1:5432,db2:5433/jobq"
