"""What the MCP client scenarios share: a tool result's text, and one check printed as a
JSON line (the Rust test reads them) that ends the scenario when it fails."""

import json


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def check(name, ok, detail=""):
    print(json.dumps({"check": name, "ok": bool(ok), "detail": str(detail)[:2000]}), flush=True)
    if not ok:
        raise SystemExit(f"check failed: {name}: {detail}")
