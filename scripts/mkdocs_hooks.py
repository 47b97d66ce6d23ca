"""mkdocs hooks (mkdocs.yml's `hooks:`): the Sphinx roles the Python docstrings use
(:class:`~rlsched.Client`, :func:`plan_step`) rendered as code, the role dropped and,
after a ``~``, the name's last part kept, as Sphinx shows them."""

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def _shown(match):
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html, **kwargs):
    return _ROLE.sub(_shown, html)
