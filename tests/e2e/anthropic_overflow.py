"""The official Anthropic Python SDK against a proxy that refuses an overflow itself
(tests/messages_exact.rs).

Usage: anthropic_overflow.py BASE_URL. Sends one request whose system prompt alone is larger
than the model's window and prints what the SDK raised: the exception's class, the status, the
error's type and message.
"""

import json
import sys

import anthropic

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="sk-ant-e2e", max_retries=0)
system = "".join(f"Rule {i}: keep every public function documented and tested.\n" for i in range(700))
out = {}
try:
    client.messages.create(
        model="claude-tiny-1",
        max_tokens=256,
        system=system,
        messages=[{"role": "user", "content": "Hello"}],
    )
    out["error"] = None
except anthropic.APIStatusError as e:
    out["error"] = type(e).__name__
    out["status"] = e.status_code
    body = e.body if isinstance(e.body, dict) else {}
    error = body.get("error", {})
    out["type"] = error.get("type")
    out["message"] = error.get("message")
print(json.dumps(out))
