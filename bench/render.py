"""Time of one `render()` of a typical email (subject, text, html with a 5-item loop), budgets included.

    .venv/bin/python bench/render.py [--n 20000] [--isolated-n 500]

Prints microseconds per render with the compiled template cached (the send path renders once per
notification, channel and locale in a batch). Compare with a checkout from before templates_app/budget.py to
see what the budgets cost. Where the checkout has templates_app/isolation.py, it also prints the cost of a
template outside the bounded subset (the same email written with a macro), rendered in a render child one at
a time and in batches of 100 (`render_many`, one round trip per batch).
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
    parser.add_argument("--isolated-n", type=int, default=500)
    args = parser.parse_args()
    n = args.n
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
    try:
        from templates_app import isolation
        from templates_app.rendering import render_many
    except ImportError:
        return
    macro = {**email, "text": "{% macro line(i) %}{{ i.name }} x{{ i.qty }}{% endmacro %}Hi {{ name }}, "
             "{% for i in items %}{{ line(i) }}\n{% endfor %}"}  # fmt: skip
    isolated = TemplateVersion(pk=2, template=template, version=2, content={"en": {"email": macro}})
    render(isolated, channel="email", locale="en", payload=payload)  # starts the child, compiles there
    m = args.isolated_n
    start = time.perf_counter()
    for _ in range(m):
        render(isolated, channel="email", locale="en", payload=payload)
    print(f"{1e6 * (time.perf_counter() - start) / m:.1f} us per render in a render child, one at a time ({m} renders)")
    batch = [(isolated, "email", "en", payload)] * 100
    start = time.perf_counter()
    for _ in range(max(m // 100, 1)):
        render_many(batch)
    total = max(m // 100, 1) * 100
    print(f"{1e6 * (time.perf_counter() - start) / total:.1f} us per render in a render child, batches of 100")
    isolation.POOL.close()


if __name__ == "__main__":
    main()
