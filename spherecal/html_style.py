"""The look the project's self-contained HTML pages share (the audit page,
``spherecal.audit_html``, and the run report, ``spherecal.run_report``): page, heading
and caption rules, inline, so both read the same offline and years later."""

from __future__ import annotations

__all__ = ["PAGE_CSS"]

PAGE_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;
margin:0;background:#f5f6f8}
main{max-width:1060px;margin:0 auto;padding:24px 28px;background:#fff}
h1{font-size:22px;margin:0 0 2px}h2{font-size:17px;margin:22px 0 8px;
border-bottom:1px solid #e3e5e8;padding-bottom:4px}
.meta{color:#5f6368;font-size:13px;margin:0}
"""
