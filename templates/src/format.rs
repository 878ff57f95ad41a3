//! What a model family's text looks like around the answer, decided once from its chat
//! template: which output parser reads its replies, how it opens and closes reasoning, how it
//! frames a tool call (for constrained decoding, which must write calls the parser reads
//! back), and which tokens end its turn. Every model-specific marker string lives here, so
//! adding a family touches this file and its parser only.

use crate::TemplateSource;
use crate::parse::{DeclaredTool, OutputFormat, ParserOptions};

/// Opens Hermes/Qwen reasoning.
pub(crate) const THINK_OPEN: &str = "<think>";
/// Closes Hermes/Qwen reasoning.
pub(crate) const THINK_CLOSE: &str = "</think>";
/// Opens a Hermes/Qwen tool call.
pub(crate) const TOOL_OPEN: &str = "<tool_call>";
/// Closes a Hermes/Qwen tool call.
pub(crate) const TOOL_CLOSE: &str = "</tool_call>";
/// Opens a Hermes/Qwen tool result (written where a template has no tool role).
pub(crate) const TOOL_RESPONSE_OPEN: &str = "<tool_response>";
/// Closes a Hermes/Qwen tool result.
pub(crate) const TOOL_RESPONSE_CLOSE: &str = "</tool_response>";
/// Llama 3's tool-call tag.
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
/// Opens the function of a Qwen XML tool call; the name and `>` follow.
pub(crate) const FUNCTION_OPEN: &str = "<function=";
/// Closes the function of a Qwen XML tool call.
pub(crate) const FUNCTION_CLOSE: &str = "</function>";
/// Opens a parameter of a Qwen XML tool call; the key and `>` follow.
pub(crate) const PARAMETER_OPEN: &str = "<parameter=";
/// Closes a parameter of a Qwen XML tool call.
pub(crate) const PARAMETER_CLOSE: &str = "</parameter>";

/// Tokens that end a turn in the families we know, besides the tokenizer's EOS: ChatML's,
/// Llama 3's (turn and text), Gemma's, and GPT-2-style end of text.
const END_OF_TURN: &[&str] = &["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|endoftext|>"];

/// How a tool call is written, so a grammar can force one the parser reads back as a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCallFraming {
    /// The key of the call object holding the arguments (`"arguments"` or `"parameters"`).
    pub arguments_key: &'static str,
    /// Text before the call object (may be empty).
    pub open: &'static str,
    /// Text after the call object (may be empty).
    pub close: &'static str,
    /// Text between two calls in a row.
    pub separator: &'static str,
}

/// A model family's output conventions, built once per loaded template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFormat {
    /// The output parser family.
    pub output: OutputFormat,
}

impl ModelFormat {
    /// The format of a family's output parser.
    pub fn new(output: OutputFormat) -> Self {
        ModelFormat { output }
    }

    /// Recognises the family from its template text: a template that writes `<function=` and
    /// `<parameter=` tags inside `<tool_call>` is Qwen XML (Qwen3.5, Qwen3-Coder), one that
    /// shows other Hermes tool calls is Hermes (Qwen2.5, Qwen3), one with Llama 3's tag is
    /// Llama 3, anything else is plain text.
    pub fn from_source(source: &TemplateSource) -> Self {
        let shows = |marker: &str| source.templates.values().any(|t| t.contains(marker));
        let output = if shows(TOOL_OPEN) && shows(FUNCTION_OPEN) && shows(PARAMETER_OPEN) {
            OutputFormat::QwenXml
        } else if shows(TOOL_OPEN) {
            OutputFormat::Hermes
        } else if shows(PYTHON_TAG) {
            OutputFormat::Llama3Json
        } else {
            OutputFormat::Plain
        };
        ModelFormat::new(output)
    }

    /// Whether a rendered prompt leaves the reply inside reasoning (Qwen3's and Qwen3.5's
    /// generation prompts end in an open `<think>`), which the parser cannot see from the reply
    /// alone.
    pub fn starts_in_reasoning(&self, prompt_text: &str) -> bool {
        matches!(self.output, OutputFormat::Hermes | OutputFormat::QwenXml)
            && prompt_text.trim_end().ends_with(THINK_OPEN)
    }

    /// The marker that closes reasoning ([`starts_in_reasoning`](Self::starts_in_reasoning)).
    pub fn reasoning_close(&self) -> &'static str {
        THINK_CLOSE
    }

    /// The format of a reply whose tools we described in the system prompt (the template shows
    /// none): the description asks for Hermes calls, whatever the family would otherwise write.
    pub fn with_described_tools(&self) -> ModelFormat {
        ModelFormat::new(OutputFormat::Hermes)
    }

    /// The parser options of one chat reply to `prompt_text`. `declared_tools`, where given,
    /// type Qwen XML parameters and turn a reply that is only a bare call object into a call.
    pub fn parser_options(
        &self,
        prompt_text: &str,
        tool_call_id_prefix: String,
        tools_enabled: bool,
        declared_tools: Vec<DeclaredTool>,
    ) -> ParserOptions {
        ParserOptions {
            format: self.output,
            starts_in_reasoning: self.starts_in_reasoning(prompt_text),
            tool_call_id_prefix,
            tools_enabled,
            declared_tools,
        }
    }

    /// How this family writes a tool call; `None` when it has no tool-call format. Qwen XML
    /// shares Hermes' `<tool_call>` tags: a forced call writes its XML inside them, or, for a
    /// tool whose schema the XML form cannot hold to, Hermes JSON, which its parser reads too.
    pub fn tool_call_framing(&self) -> Option<ToolCallFraming> {
        match self.output {
            OutputFormat::Hermes | OutputFormat::QwenXml => Some(ToolCallFraming {
                arguments_key: "arguments",
                open: "<tool_call>\n",
                close: "\n</tool_call>",
                separator: "\n",
            }),
            OutputFormat::Llama3Json => {
                Some(ToolCallFraming { arguments_key: "parameters", open: "", close: "", separator: "; " })
            }
            OutputFormat::Plain => None,
        }
    }

    /// Token texts that end a turn besides the tokenizer's EOS; a tokenizer that lacks one
    /// simply has no such token.
    pub fn end_of_turn(&self) -> &'static [&'static str] {
        END_OF_TURN
    }
}

/// A tool call written as Hermes text, for templates without tool support: what our Hermes
/// parser reads back as a call.
pub(crate) fn hermes_call_text(name: &str, arguments: &str) -> String {
    format!("{TOOL_OPEN}\n{{\"name\": {name}, \"arguments\": {arguments}}}\n{TOOL_CLOSE}")
}

/// A tool result written as Hermes text, for templates without a tool role.
pub(crate) fn hermes_result_text(content: &str) -> String {
    format!("{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn source(text: &str) -> TemplateSource {
        TemplateSource {
            templates: BTreeMap::from([("default".to_owned(), text.to_owned())]),
            special_tokens: BTreeMap::new(),
            origin: "t.jinja".into(),
        }
    }

    #[test]
    fn the_family_comes_from_the_template() {
        assert_eq!(ModelFormat::from_source(&source("{{ '<tool_call>' }}")).output, OutputFormat::Hermes);
        let xml = "{{ '<tool_call>\\n<function=' + name + '>\\n' }}{{ '<parameter=' + key + '>\\n' }}";
        assert_eq!(ModelFormat::from_source(&source(xml)).output, OutputFormat::QwenXml);
        // Prose that mentions the tags without calls is not enough.
        assert_eq!(ModelFormat::from_source(&source("<function=f> and <parameter=p>")).output, OutputFormat::Plain);
        assert_eq!(ModelFormat::from_source(&source("{{ '<|python_tag|>' }}")).output, OutputFormat::Llama3Json);
        assert_eq!(ModelFormat::from_source(&source("{{ messages }}")).output, OutputFormat::Plain);
    }

    #[test]
    fn reasoning_opens_only_where_the_family_has_it() {
        let hermes = ModelFormat::new(OutputFormat::Hermes);
        assert!(hermes.starts_in_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!hermes.starts_in_reasoning("<|im_start|>assistant\n"));
        let xml = ModelFormat::new(OutputFormat::QwenXml);
        assert!(xml.starts_in_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!xml.starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!ModelFormat::new(OutputFormat::Plain).starts_in_reasoning("<think>\n"));
    }
}
