"""Time of one `render()` of a typical email (subject, text, html with a 5-item loop), budgets included.

    .venv/bin/python bench/render.py [--n 20000]

Prints microseconds per render with the compiled template cached (the send path renders once per
notification, channel and locale in a batch). Compare with a checkout from before templates_app/budget.py to
see what the budgets cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEVELOPMENT", "true")  # a local benchmark: the built-in SECRET_KEY is fine


def main() -> None:
    """Render the same version n times and print the time per render."""
    import django

    django.setup()
    from templates_app.models import Template, TemplateVersion
    from templates_app.rendering import render

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    template = Template(key="bench", category="transactional", default_locale="en")
    email = {
        "subject": "Order {{ order_id }} shipped",
        "text": "Hi {{ name }}, {% for i in items %}{{ i.name }} x{{ i.qty }}\n{% endfor %}",
        "html": "<p>Hi {{ name }}</p>{% for i in items %}<li>{{ i.name ~ ' x' ~ i.qty }}</li>{% endfor %}",
    }
    version = TemplateVersion(pk=1, template=template, version=1, content={"en": {"email": email}})
    payload = {"order_id": "A-1", "name": "Ada", "items": [{"name": f"item{i}", "qty": i} for i in range(5)]}
    render(version, channel="email", locale="en", payload=payload)
    start = time.perf_counter()
    for _ in range(n):
        render(version, channel="email", locale="en", payload=payload)
    print(f"{1e6 * (time.perf_counter() - start) / n:.1f} us per render ({n} renders)")


if __name__ == "__main__":
    main()
