"""A view that enqueues in the request's own transaction: the welcome job
exists if and only if the signup row commits (the reapers publish it right
after the commit). A bad address rolls both back: nothing half-done."""

import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from jobq import InvalidPayload
from signup.models import Signup
from signup.tasks import Welcome, send_welcome


@csrf_exempt
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    try:
        with transaction.atomic():
            row = Signup.objects.create(email=request.POST.get("email", ""))
            payload = send_welcome.encode(Welcome(signup_id=row.id, email=row.email))
            with connection.cursor() as cur:
                cur.execute("SELECT jobq.enqueue(%s, %s::jsonb)",
                            [send_welcome.queue, json.dumps(payload)])
                (job_id,) = cur.fetchone()
    except (InvalidPayload, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"signup": row.id, "job": str(job_id)}, status=201)
