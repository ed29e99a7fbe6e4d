"""The floor of this stack: a bare Django view that parses a JSON body, inserts one row and answers 202.

Served by bench/floor.py under the same gunicorn settings as the API (`gunicorn -c gunicorn.conf.py
bench.floor_app:application`), on the same database connection settings (DATABASE_URL, conn_max_age), with no
middleware, no authentication and no ORM: what any Django service on this box pays for one accepted request.
"""

from __future__ import annotations

import json
import os

import dj_database_url
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="floor-only",  # a benchmark's throwaway server on loopback
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    INSTALLED_APPS=[],
    USE_TZ=True,
    DATABASES={
        "default": dj_database_url.parse(
            os.environ["DATABASE_URL"], conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "60"))
        )
    },
)

import django  # noqa: E402  # after settings.configure, as a settings-less Django app must

django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

TABLE_SQL = "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, body jsonb NOT NULL, at timestamptz)"


@csrf_exempt
def accept(request: HttpRequest) -> HttpResponse:
    """Parse the body, insert it as one row, answer 202 with the row's id."""
    body = json.loads(request.body)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_floor (body, at) VALUES (%s, now()) RETURNING id", [json.dumps(body)])
        (row_id,) = cursor.fetchone()
    return JsonResponse({"id": row_id}, status=202)


def healthz(request: HttpRequest) -> HttpResponse:
    """Answer 200: the server is up."""
    return HttpResponse("ok")


urlpatterns = [path("floor", accept), path("healthz", healthz)]
application = get_wsgi_application()
