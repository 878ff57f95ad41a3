//! Shortcuts for tests and probes, here so that this crate's integration tests and other crates'
//! tests share them; the serving path never calls them.

use std::collections::BTreeMap;

use crate::parse::{ParsedMessage, ParserOptions, StreamingParser};
use crate::{ChatTemplate, TemplateError, TemplateSource};

/// Parses a whole reply. Equals `ParsedMessage::from_events` of a fresh
/// [`StreamingParser`]'s `push(text)` followed by `finish()`, for any chunking of `text`.
pub fn parse_complete(opts: &ParserOptions, text: &str) -> ParsedMessage {
    let mut parser = StreamingParser::new(opts.clone());
    let mut events = parser.push(text);
    events.extend(parser.finish());
    ParsedMessage::from_events(events)
}

/// Compiles one inline template text with the given special tokens.
pub fn template_from_text(text: &str, special_tokens: BTreeMap<String, String>) -> Result<ChatTemplate, TemplateError> {
    ChatTemplate::new(TemplateSource {
        templates: BTreeMap::from([("default".to_owned(), text.to_owned())]),
        special_tokens,
        origin: "<inline>".into(),
    })
}
