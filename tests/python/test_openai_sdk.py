"""radix-serve through the official OpenAI Python SDK (version pinned in requirements.txt).

Run against a server started with a tool-capable template (tests/tests/sdk_clients.rs uses
benches/templates/chatml_tools.jinja): RADIX_BASE_URL=http://127.0.0.1:PORT python test_openai_sdk.py
"""

import json

import openai
from openai import OpenAI

from sdkcheck import base_url, check, run

client = OpenAI(base_url=base_url() + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = client.models.list().data[0].id
QUESTION = [{"role": "user", "content": "Name three colours and say why you like them."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file path"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite.",
            "parameters": {"type": "object", "properties": {"filter": {"type": "string"}}},
        },
    },
]


@check
def models_lists_the_served_model():
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL], models
    assert models.data[0].object == "model"


def greedy(**extra):
    return client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0, **extra)


@check
def chat_non_streaming():
    response = greedy()
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content, response
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    assert response.usage.prompt_tokens > 0 and 1 <= response.usage.completion_tokens <= 16
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    assert response.usage.prompt_tokens_details.cached_tokens is not None


@check
def chat_streaming_matches_non_streaming():
    expected = greedy()
    parts, finish, usage = [], None, None
    for chunk in greedy(stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    assert "".join(parts) == expected.choices[0].message.content, (parts, expected)
    assert finish == expected.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == expected.usage.completion_tokens


@check
def cached_tokens_on_a_repeated_prefix():
    system = "You are a careful coding agent. " + " ".join(f"Rule {i}: keep every diff small." for i in range(80))
    seen = []
    for question in ["What should I check first?", "And what next?"]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        seen.append(response.usage)
    second = seen[1]
    assert second.prompt_tokens_details.cached_tokens > 0, second
    # The whole system prompt is shared, so most of the second prompt is cached.
    assert second.prompt_tokens_details.cached_tokens * 2 > second.prompt_tokens, second


@check
def legacy_completions():
    response = client.completions.create(model=MODEL, prompt="The three primary colours are", max_tokens=8, temperature=0)
    assert response.object == "text_completion"
    assert response.choices[0].text, response
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens >= 1
    streamed = client.completions.create(
        model=MODEL, prompt="The three primary colours are", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == response.choices[0].text


@check
def named_tool_choice_streams_a_call():
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Show me the file src/main.rs."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:
                    # The first delta of each call carries its id and function name.
                    assert delta.id, delta
                    assert delta.function is not None and delta.function.name == "read_file", delta
                    calls[delta.index] = ""
                if delta.function is not None and delta.function.arguments:
                    calls[delta.index] += delta.function.arguments
            if choice.finish_reason:
                finish = choice.finish_reason
    assert calls, "a tool call was streamed"
    assert finish == "tool_calls", finish
    arguments = json.loads(calls[0])
    assert isinstance(arguments.get("path"), str), arguments


@check
def bad_request_is_a_400():
    try:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature="hot")
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.body and e.body.get("message"), e.body
    else:
        raise AssertionError("a string temperature must be rejected")


if __name__ == "__main__":
    run()
