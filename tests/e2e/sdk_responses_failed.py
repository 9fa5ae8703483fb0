"""The official OpenAI Python SDK's `responses.stream` helper on streams that fail: the
upstream sends an `error` event mid-stream, once in a plain managed stream and once in the
second round of the proxy's tool loop. The proxy must end each stream with exactly one
`response.failed` carrying the error, which the helper accepts (it checks the event order and
the response's identity) and after which `get_final_response()` raises at once: nothing hangs
(the client's timeout would fail the script). Prints one JSON object."""

import json
import sys

from openai import OpenAI


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix} line {i}: let value_{i} = compute({i}) * 2;\n" for i in range(1, n + 1))


base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-e2e", max_retries=0, timeout=30)
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
    {"role": "user", "content": "What is on line 7 of a.rs?"},
]


def failing_stream(key: str, input) -> dict:
    seen = {}
    with client.responses.stream(model="gpt-5", input=input, tools=tools, store=False,
                                 prompt_cache_key=key) as stream:
        events = [e for e in stream]
        try:
            stream.get_final_response()
            seen["final"] = "returned"
        except RuntimeError as e:
            seen["final"] = f"raised: {e}"
    seen["events"] = [e.type for e in events]
    last = events[-1]
    seen["error"] = [last.response.error.code, last.response.error.message]
    seen["status"] = last.response.status
    seen["same_id"] = last.response.id == events[0].response.id
    return seen


# A short input: nothing is moved out, the proxy offers no tool: the upstream's stream relayed.
plain = failing_stream("sdk-failed-plain", [{"role": "user", "content": "What is on line 7 of a.rs?"}])
# The long one: the output is moved out and read back, the second round fails.
loop = failing_stream("sdk-failed-loop", history)
print(json.dumps({"plain": plain, "loop": loop}))
