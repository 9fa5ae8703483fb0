"""Drives context-proxy with the official OpenAI Python SDK.

Usage: sdk_client.py BASE_URL. The Rust test (tests/sdk_e2e.rs) queues the mock upstream's
replies in this order: text, text (streamed), tool calls, tool calls (streamed), then a 429.
Prints one JSON object with what the SDK saw; exits non-zero on any assertion failure.
"""

import json
import sys

import openai
from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="sk-e2e", max_retries=0)
    out = {}
    messages = [{"role": "user", "content": "Hello"}]

    r = client.chat.completions.create(model="gpt-4o", messages=messages)
    assert r.object == "chat.completion", r
    out["text"] = r.choices[0].message.content
    out["usage_prompt"] = r.usage.prompt_tokens

    stream = client.chat.completions.create(
        model="gpt-4o", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
    out["stream_text"] = "".join(parts)
    out["stream_usage_total"] = usage.total_tokens if usage else None

    r = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS, tool_choice="auto")
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls", r
    out["tool_calls"] = [[c.function.name, json.loads(c.function.arguments)] for c in calls]

    with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=TOOLS) as s:
        final = s.get_final_completion()
    out["stream_tool_calls"] = [
        [c.function.name, json.loads(c.function.arguments)] for c in final.choices[0].message.tool_calls
    ]

    try:
        client.chat.completions.create(model="gpt-4o", messages=messages)
        out["rate_limit"] = None
    except openai.RateLimitError as e:
        out["rate_limit"] = e.code

    print(json.dumps(out))


if __name__ == "__main__":
    main()
