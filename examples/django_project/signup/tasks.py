"""The jobs of the example: consumers run ``jobq consume signup.tasks:app``."""

import jobq
from pydantic import BaseModel, Field

from signup.models import Signup  # jobq consume set Django up first (DJANGO_SETTINGS_MODULE)

app = jobq.App()


class Welcome(BaseModel):
    signup_id: int
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")


@app.task("welcome_emails", payload=Welcome)
def send_welcome(job: jobq.Job[Welcome]) -> dict[str, str]:
    # A sync handler runs in the consumer's thread pool, between two
    # close_old_connections() calls, as a Django request would: the ORM works.
    signup = Signup.objects.get(pk=job.payload.signup_id)
    return {"sent_to": signup.email}
