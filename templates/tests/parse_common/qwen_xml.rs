//! Qwen XML replies (Qwen3.5's tool-call format) with their expected parse.

use super::{Fixture, WEATHER, fx, msg, opts, qwen_xml};
use radix_templates::parse::OutputFormat;

/// One call as Qwen3.5's template renders it (see `format_call` in `parse_qwen_xml.rs`).
const WEATHER_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";

pub fn fixtures() -> Vec<Fixture> {
    let reasoning = opts(OutputFormat::QwenXml, true, true);
    let no_tools = opts(OutputFormat::QwenXml, false, false);
    vec![
        fx("xml: one call", qwen_xml(), WEATHER_CALL, msg("", None, &[("get_weather", WEATHER)])),
        fx(
            "xml: reasoning, content, two calls",
            reasoning.clone(),
            "The user wants weather and time.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
            msg(
                "Let me check.\n\n",
                Some("The user wants weather and time."),
                &[("get_weather", WEATHER), ("get_time", "{}")],
            ),
        ),
        fx(
            "xml: think tag, then a call",
            qwen_xml(),
            "<think>\nNeed the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
            msg("", Some("Need the tool."), &[("get_weather", WEATHER)]),
        ),
        fx(
            "xml: typed values",
            qwen_xml(),
            "<tool_call>\n<function=search>\n<parameter=limit>\n20\n</parameter>\n<parameter=threshold>\n0.5\n</parameter>\n<parameter=epsilon>\n1e-07\n</parameter>\n<parameter=exact>\nFalse\n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n<parameter=cursor>\nNone\n</parameter>\n<parameter=filters>\n{\"dir\": \"src\", \"depth\": -3.0}\n</parameter>\n<parameter=tags>\n[\"todo\", \"fixme ☑\"]\n</parameter>\n<parameter=text>\nmulti\nline\n</parameter>\n</function>\n</tool_call>",
            msg(
                "",
                None,
                &[(
                    "search",
                    r#"{"limit": 20, "threshold": 0.5, "epsilon": 1e-07, "exact": false, "flag": true, "cursor": null, "filters": {"dir": "src", "depth": -3.0}, "tags": ["todo", "fixme ☑"], "text": "multi\nline"}"#,
                )],
            ),
        ),
        fx(
            "xml: markup inside a value",
            qwen_xml(),
            "<tool_call>\n<function=write_file>\n<parameter=content>\n<p>a < b</p> </think> <tool_call> <think>\n\n</parameter>\n</function>\n</tool_call>",
            msg("", None, &[("write_file", r#"{"content": "<p>a < b</p> </think> <tool_call> <think>\n"}"#)]),
        ),
        fx(
            "xml: parameters left open",
            qwen_xml(),
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</function>\n</tool_call>",
            msg("", None, &[("f", r#"{"a": 1, "b": "x"}"#)]),
        ),
        fx(
            "xml: function left open",
            qwen_xml(),
            "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</tool_call>After",
            msg("After", None, &[("f", r#"{"a": "x"}"#)]),
        ),
        fx(
            "xml: cut off inside a value keeps it",
            qwen_xml(),
            "<tool_call>\n<function=search>\n<parameter=query>\nrust pars",
            msg("", None, &[("search", r#"{"query": "rust pars"}"#)]),
        ),
        fx(
            "xml: cut off inside a closing tag",
            qwen_xml(),
            "<tool_call>\n<function=search>\n<parameter=query>\nrust\n</param",
            msg("", None, &[("search", r#"{"query": "rust\n</param"}"#)]),
        ),
        fx(
            "xml: cut off before the name closes is content",
            qwen_xml(),
            "Let me check. <tool_call>\n<function=get_wea",
            msg("Let me check. <tool_call>\n<function=get_wea", None, &[]),
        ),
        fx(
            "xml: not a call",
            qwen_xml(),
            "Sure.<tool_call>\nnot xml\n</tool_call>",
            msg("Sure.<tool_call>\nnot xml\n</tool_call>", None, &[]),
        ),
        fx(
            "xml: a newline in the name",
            qwen_xml(),
            "<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>",
            msg("<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>", None, &[]),
        ),
        fx(
            "xml: an empty name",
            qwen_xml(),
            "<tool_call><function=  ></function></tool_call>",
            msg("<tool_call><function=  ></function></tool_call>", None, &[]),
        ),
        fx(
            "xml: a Hermes JSON call inside the tags",
            qwen_xml(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            msg("", None, &[("get_weather", WEATHER)]),
        ),
        fx(
            "xml: malformed JSON inside the tags is content",
            qwen_xml(),
            "<tool_call>\n{\"arguments\": {}}</tool_call>",
            msg("<tool_call>\n{\"arguments\": {}}</tool_call>", None, &[]),
        ),
        fx(
            "xml: text after the call",
            qwen_xml(),
            "<tool_call>\n<function=f>\n</function>\n</tool_call>\nDone.",
            msg("\nDone.", None, &[("f", "{}")]),
        ),
        fx(
            "xml: junk between parameters ends the call",
            qwen_xml(),
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\noops\n</function>\n</tool_call>",
            msg("oops\n</function>\n</tool_call>", None, &[("f", r#"{"a": 1}"#)]),
        ),
        fx(
            "xml: junk after the function, then its </tool_call>",
            qwen_xml(),
            "<tool_call>\n<function=f>\n</function>\n<tool_call>\n<function=g>\n</function>\n</tool_call>",
            msg("", None, &[("f", "{}"), ("g", "{}")]),
        ),
        fx(
            "xml: a broken parameter tag",
            qwen_xml(),
            "<tool_call>\n<function=f>\n<parameter=a\nb>\n1\n</parameter>\n</function>\n</tool_call>",
            msg("<parameter=a\nb>\n1\n</parameter>\n</function>\n</tool_call>", None, &[("f", "{}")]),
        ),
        fx(
            "xml: no newlines at all",
            qwen_xml(),
            "<tool_call><function=f><parameter=a>1</parameter><parameter=b>two</parameter></function></tool_call>",
            msg("", None, &[("f", r#"{"a": 1, "b": "two"}"#)]),
        ),
        fx(
            "xml: unicode names, keys and values",
            qwen_xml(),
            "今天 ☀️ <tool_call>\n<function=記録>\n<parameter=メモ>\n晴れ☀️ 👍🏽\n</parameter>\n</function>\n</tool_call>",
            msg("今天 ☀️ ", None, &[("記録", r#"{"メモ": "晴れ☀️ 👍🏽"}"#)]),
        ),
        fx(
            "xml: tools disabled",
            no_tools,
            "Use <tool_call>\n<function=f>\n</function>\n</tool_call> to call.",
            msg("Use <tool_call>\n<function=f>\n</function>\n</tool_call> to call.", None, &[]),
        ),
        fx(
            "xml: function tags outside a call are text",
            qwen_xml(),
            "Write <function=f> and <parameter=p>v</parameter></function>.",
            msg("Write <function=f> and <parameter=p>v</parameter></function>.", None, &[]),
        ),
        fx("xml: empty reasoning, then text", reasoning, "\n\n</think>\n\nHi", msg("Hi", None, &[])),
    ]
}
