"""The jobs of the example: consumers run ``jobq consume signup.tasks:app``."""

import jobq
from pydantic import BaseModel, Field

app = jobq.App()


class Welcome(BaseModel):
    signup_id: int
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")


@app.task("welcome_emails", payload=Welcome)
def send_welcome(job: jobq.Job[Welcome]) -> dict[str, str]:
    # a sync handler runs in the consumer's thread pool; send the email here
    return {"sent_to": job.payload.email}
