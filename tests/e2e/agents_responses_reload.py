"""An OpenAI Agents SDK run on its default model, the Responses API, through the proxy: the
model reads two files with the client's tool, reads a line of the first back through the
proxy's `context_read` (moved out by then), runs the tests, answers. The agent never sees the
proxy's tool, and its usage is every upstream call's. Prints one JSON object."""

import asyncio
import json
import sys

from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

HIDDEN = ("context_read", "context_search")


def lines(prefix: str, n: int) -> str:
    return "".join(f"{prefix} line {i}: let value_{i} = compute({i}) * 2;\n" for i in range(1, n + 1))


def assert_invisible(text: str) -> None:
    for name in HIDDEN:
        assert name not in text, f"the client saw {name}: {text[:2000]}"


async def main(base: str) -> dict:
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=base, api_key="sk-e2e", max_retries=0),
                              use_for_tracing=False)
    calls = []

    @function_tool
    def read_file(path: str) -> str:
        """Read a file."""
        calls.append(["read_file", path])
        return lines(path, 600 if path == "a.rs" else 400)

    @function_tool
    def run_tests() -> str:
        """Run the tests."""
        calls.append(["run_tests"])
        return "12 passed"

    # No model class named: the SDK's default, OpenAIResponsesModel on POST /v1/responses.
    agent = Agent(name="coder", instructions="You are a coding agent.", model="gpt-4o",
                  tools=[read_file, run_tests])
    result = await Runner.run(agent, "Read a.rs and b.rs, check line 7 of a.rs, then run the tests.")
    assert_invisible(json.dumps([str(i) for i in result.new_items]))
    assert_invisible(json.dumps([r.model_dump_json() if hasattr(r, "model_dump_json") else str(r)
                                 for r in result.raw_responses]))
    return {
        "agent_output": result.final_output,
        "agent_calls": calls,
        "responses": len(result.raw_responses),
        "input_tokens": result.context_wrapper.usage.input_tokens,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
