"""The official OpenAI Python SDK's Responses API reading back through the proxy: the input's
large tool output does not fit the proxy's small budget and is taken out of the context, with a
needle in the part no longer shown; the mock (in reader mode) calls the proxy's `context_read`,
the proxy answers it and asks again, and the model answers with the needle. `responses.create` and `responses.stream` (whose helper checks the
event order as it assembles the response) must never show the proxy's tool or its items, and
report the usage summed over both upstream calls. Prints one JSON object."""

import json
import sys

from openai import OpenAI

HIDDEN = ("context_read", "context_search")


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"
                   + ("NEEDLE port=7411\n" if i == 150 else "") for i in range(1, n + 1))


def assert_invisible(text: str) -> None:
    for name in HIDDEN:
        assert name not in text, f"the client saw {name}: {text[:2000]}"


base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-e2e", max_retries=0)
tools = [{
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "array", "items": {"type": "string"}}},
                   "required": ["cmd"], "additionalProperties": False},
    "strict": True,
}]
history = [
    {"role": "user", "content": "Read a.rs."},
    {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": json.dumps({"cmd": ["cat", "a.rs"]})},
    {"type": "function_call_output", "call_id": "call_a", "output": lines("a.rs", 600)},
    {"role": "assistant", "content": "It defines compute-based values."},
    {"role": "user", "content": "Recall the needles: port"},
]

out = {}
raw = client.responses.with_raw_response.create(
    model="gpt-5", input=history, tools=tools, store=False, prompt_cache_key="sdk-reload")
out["create_reload"] = raw.headers.get("x-context-reload")
out["create_tokens"] = [int(raw.headers.get(f"x-context-tokens-{k}")) for k in ("before", "after")]
response = raw.parse()
assert_invisible(response.model_dump_json())
out["create_text"] = response.output_text
out["create_types"] = [i.type for i in response.output]
out["create_tools"] = [t.name for t in response.tools]
out["create_usage"] = response.usage.model_dump()

events = []
with client.responses.stream(model="gpt-5", input=history, tools=tools, store=False,
                             prompt_cache_key="sdk-reload") as stream:
    for event in stream:
        events.append(event)
    final = stream.get_final_response()
assert_invisible("\n".join(e.model_dump_json() for e in events))
assert_invisible(final.model_dump_json())
out["stream_events"] = [e.type for e in events]
out["stream_text"] = final.output_text
out["stream_types"] = [i.type for i in final.output]
out["stream_usage"] = final.usage.model_dump()
print(json.dumps(out))
