//! Each format's markers (their strings live in crate::format) and how to recognise them at the
//! front of a buffer.

pub(crate) use crate::format::{
    FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_CLOSE, PARAMETER_OPEN, PYTHON_TAG, THINK_CLOSE, THINK_OPEN, TOOL_CLOSE,
    TOOL_OPEN,
};

/// Markers of [`super::OutputFormat::Hermes`]. None is a prefix of another.
pub(crate) const HERMES_MARKERS: &[&str] = &[THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE];
/// What may follow a Qwen XML call's parameter list: a parameter, the function's end, or the
/// call's end (a function left open). None is a prefix of another.
pub(crate) const XML_BODY_MARKERS: &[&str] = &[PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CLOSE];
/// What ends a Qwen XML parameter value: its own end tag, or (where the model left it open)
/// the next parameter, the function's end or the call's end. None is a prefix of another.
pub(crate) const XML_VALUE_ENDS: &[&str] = &[PARAMETER_CLOSE, PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CLOSE];
/// Markers of [`super::OutputFormat::Llama3Json`].
pub(crate) const LLAMA3_MARKERS: &[&str] = &[PYTHON_TAG];

/// What the front of a buffer is, marker-wise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// The buffer starts with this marker.
    Full(&'static str),
    /// The whole buffer is a strict prefix of a marker and more text may follow: wait.
    Partial,
    /// No marker starts here.
    None,
}

/// Classifies `rest` (the unconsumed buffer from a `<`) against `markers`. With `at_end`
/// no more text can come, so a strict prefix is [`Match::None`].
pub(crate) fn match_at(rest: &str, markers: &[&'static str], at_end: bool) -> Match {
    if let Some(m) = markers.iter().find(|m| rest.starts_with(**m)) {
        return Match::Full(m);
    }
    if !at_end && markers.iter().any(|m| m.len() > rest.len() && m.starts_with(rest)) {
        return Match::Partial;
    }
    Match::None
}

/// Splits `text` into pieces so that every marker occurrence starts a piece: yields
/// `(piece, starts_with_marker)`.
pub(crate) fn split_at_markers<'a>(text: &'a str, markers: &[&'static str]) -> Vec<(&'a str, bool)> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut marker_start = false;
    let mut i = 0;
    while let Some(off) = text[i..].find('<') {
        let at = i + off;
        match markers.iter().find(|m| text[at..].starts_with(**m)) {
            Some(m) => {
                if at > start {
                    pieces.push((&text[start..at], marker_start));
                }
                start = at;
                marker_start = true;
                i = at + m.len();
            }
            None => i = at + 1,
        }
    }
    if start < text.len() {
        pieces.push((&text[start..], marker_start));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_front() {
        assert_eq!(match_at("<think>x", HERMES_MARKERS, false), Match::Full(THINK_OPEN));
        assert_eq!(match_at("</t", HERMES_MARKERS, false), Match::Partial);
        assert_eq!(match_at("</t", HERMES_MARKERS, true), Match::None);
        assert_eq!(match_at("<b>", HERMES_MARKERS, false), Match::None);
        assert_eq!(match_at("<", LLAMA3_MARKERS, false), Match::Partial);
    }

    #[test]
    fn split() {
        let s = "a<think>b</think><tool_call>c<";
        let pieces = split_at_markers(s, HERMES_MARKERS);
        assert_eq!(pieces, vec![("a", false), ("<think>b", true), ("</think>", true), ("<tool_call>c<", true)]);
        assert!(split_at_markers("", HERMES_MARKERS).is_empty());
    }
}
