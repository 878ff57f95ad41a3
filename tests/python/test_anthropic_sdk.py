"""radix-serve's Messages API through the official Anthropic Python SDK (version pinned in
requirements.txt).

Run against a server started with a tool-capable template (tests/tests/sdk_clients.rs uses
benches/templates/chatml_tools.jinja): RADIX_BASE_URL=http://127.0.0.1:PORT python test_anthropic_sdk.py
"""

import json
import urllib.request

import anthropic
from anthropic import Anthropic

from sdkcheck import base_url, check, run

client = Anthropic(base_url=base_url(), api_key="unused", max_retries=0, timeout=600)
with urllib.request.urlopen(base_url() + "/v1/models") as response:
    MODEL = json.load(response)["data"][0]["id"]
QUESTION = [{"role": "user", "content": "Name three colours and say why you like them."}]
# This SDK version has no sampling parameters; the server still takes Anthropic's `temperature`.
GREEDY = {"temperature": 0}
SYSTEM = [
    {"type": "text", "text": "You are a careful coding agent."},
    {
        "type": "text",
        "text": " ".join(f"Rule {i}: keep every diff small." for i in range(80)),
        "cache_control": {"type": "ephemeral"},
    },
]
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "file path"}},
            "required": ["path"],
        },
    }
]


def text(message):
    return "".join(block.text for block in message.content if block.type == "text")


def greedy():
    return client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=QUESTION)


@check
def create_non_streaming():
    message = greedy()
    assert message.type == "message" and message.role == "assistant", message
    assert message.id.startswith("msg_")
    assert text(message), message
    assert message.stop_reason in ("end_turn", "max_tokens"), message.stop_reason
    assert 1 <= message.usage.output_tokens <= 16
    count = client.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == count, (message.usage, count)


@check
def stream_matches_create():
    expected = greedy()
    with client.messages.stream(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=QUESTION) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text(expected), (streamed, text(expected))
    assert text(final) == streamed
    assert final.stop_reason == expected.stop_reason
    assert final.usage.output_tokens == expected.usage.output_tokens


@check
def cache_read_on_a_repeat():
    usages = []
    for question in ["What should I check first?", "And what next?"]:
        message = client.messages.create(
            model=MODEL, max_tokens=4, extra_body=GREEDY, system=SYSTEM, messages=[{"role": "user", "content": question}]
        )
        usages.append(message.usage)
    second = usages[1]
    assert second.cache_read_input_tokens and second.cache_read_input_tokens > 0, second
    assert second.cache_read_input_tokens > second.input_tokens, "the shared system prompt is most of it"
    count = client.messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": "And what next?"}]
    ).input_tokens
    assert second.input_tokens + second.cache_read_input_tokens == count, (second, count)


@check
def count_tokens_grows_with_a_tool_round_trip():
    asked = [{"role": "user", "content": "Show me the file src/main.rs."}]
    answered = asked + [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "src/main.rs"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "fn main() {}"}]},
    ]
    before = client.messages.count_tokens(model=MODEL, tools=TOOLS, messages=asked).input_tokens
    after = client.messages.count_tokens(model=MODEL, tools=TOOLS, messages=answered).input_tokens
    assert 0 < before < after, (before, after)


@check
def forced_tool_use():
    kwargs = dict(
        model=MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "read_file"},
        messages=[{"role": "user", "content": "Show me the file src/main.rs."}],
    )
    message = client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use", message
    calls = [block for block in message.content if block.type == "tool_use"]
    assert calls and calls[0].name == "read_file" and calls[0].id, message
    assert isinstance(calls[0].input.get("path"), str), calls[0].input
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in calls], (final, message)


@check
def bad_request_is_an_invalid_request_error():
    try:
        client.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)
    except anthropic.BadRequestError as e:
        assert e.status_code == 400
        assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
    else:
        raise AssertionError("max_tokens 0 must be rejected")


if __name__ == "__main__":
    run()
