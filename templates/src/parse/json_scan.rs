//! A small incremental JSON scanner, fed one character at a time: [`ValueScanner`] finds
//! where a JSON value ends (tracking strings, escapes and bracket nesting, not validating
//! numbers or literals), [`ObjectScanner`] walks a tool-call object and reports which
//! characters belong to the `"arguments"` value and when the `"name"` is complete.

/// JSON insignificant whitespace.
pub(crate) fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// What one character did to a [`ValueScanner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The character is part of the value, which goes on.
    More,
    /// The character is part of the value and ends it.
    Done,
    /// The value (a bare number or literal) ended just before this character, which is not
    /// part of it.
    DoneBefore,
    /// The character cannot be part of the value: a bad first character, a `<` outside a
    /// string, or a closing bracket that does not match.
    Error,
}

/// Finds the end of one JSON value. Lenient inside containers (anything but `<` and a
/// mismatched bracket is accepted outside strings), so it finds the end of any valid value
/// and of most nearly-valid ones.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValueScanner {
    /// Closing brackets expected, innermost last.
    stack: Vec<u8>,
    started: bool,
    in_string: bool,
    escape: bool,
    primitive: bool,
}

impl ValueScanner {
    /// Feeds the next character (the first one must not be whitespace).
    pub(crate) fn feed(&mut self, c: char) -> Step {
        if !self.started {
            let step = match c {
                '{' => {
                    self.stack.push(b'}');
                    Step::More
                }
                '[' => {
                    self.stack.push(b']');
                    Step::More
                }
                '"' => {
                    self.in_string = true;
                    Step::More
                }
                c if c == '-' || c.is_ascii_alphanumeric() => {
                    self.primitive = true;
                    Step::More
                }
                _ => Step::Error,
            };
            self.started = step != Step::Error;
            return step;
        }
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if c == '\\' {
                self.escape = true;
            } else if c == '"' {
                self.in_string = false;
                if self.stack.is_empty() {
                    return Step::Done;
                }
            }
            return Step::More;
        }
        if self.primitive {
            return if c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.') {
                Step::More
            } else {
                Step::DoneBefore
            };
        }
        match c {
            '"' => {
                self.in_string = true;
                Step::More
            }
            '{' => {
                self.stack.push(b'}');
                Step::More
            }
            '[' => {
                self.stack.push(b']');
                Step::More
            }
            '}' | ']' => {
                if self.stack.last() == Some(&(c as u8)) {
                    self.stack.pop();
                    if self.stack.is_empty() { Step::Done } else { Step::More }
                } else {
                    Step::Error
                }
            }
            '<' => Step::Error,
            _ => Step::More,
        }
    }
}

/// What one character did to an [`ObjectScanner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Feed {
    /// Consumed: framing, whitespace, a key, or part of a value that is not the arguments.
    Structural,
    /// Consumed: part of the arguments value.
    Args,
    /// Consumed: it closed the name string; here is the decoded, non-empty name.
    Name(String),
    /// Consumed: it closed the object.
    End,
    /// Not consumed: the object is malformed at this character.
    Error,
}

/// Which key a value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Name,
    Args,
    Skip,
}

#[derive(Debug, Clone)]
enum Pos {
    /// Before the object: whitespace, then `{`.
    Open,
    /// After `{` or `,`: whitespace, then a key or `}`.
    Key,
    /// Inside a key string (raw text so far, including the opening quote).
    InKey { raw: String, escape: bool },
    /// After a key: whitespace, then `:`.
    Colon(Slot),
    /// After `:`: whitespace, then the value.
    ValueStart(Slot),
    /// Inside a value (`raw` collects the name string).
    Value { slot: Slot, scan: ValueScanner, raw: String },
    /// After a value: whitespace, then `,` or `}`.
    AfterValue,
    /// The object is closed.
    Closed,
}

/// Walks one `{"name": "...", "arguments": ...}` object. The first `"name"` key must have a
/// non-empty string value; the first `"arguments"` or `"parameters"` key is the arguments;
/// other keys (and repeats) are skipped. A trailing comma before `}` is tolerated.
#[derive(Debug, Clone)]
pub(crate) struct ObjectScanner {
    pos: Pos,
    have_name: bool,
    have_args: bool,
}

impl Default for ObjectScanner {
    fn default() -> Self {
        ObjectScanner { pos: Pos::Open, have_name: false, have_args: false }
    }
}

impl ObjectScanner {
    /// Feeds the next character.
    pub(crate) fn feed(&mut self, c: char) -> Feed {
        match &mut self.pos {
            Pos::Open => match c {
                c if is_json_ws(c) => Feed::Structural,
                '{' => {
                    self.pos = Pos::Key;
                    Feed::Structural
                }
                _ => Feed::Error,
            },
            Pos::Key => match c {
                c if is_json_ws(c) => Feed::Structural,
                '"' => {
                    self.pos = Pos::InKey { raw: "\"".to_owned(), escape: false };
                    Feed::Structural
                }
                '}' => {
                    self.pos = Pos::Closed;
                    Feed::End
                }
                _ => Feed::Error,
            },
            Pos::InKey { raw, escape } => {
                raw.push(c);
                if *escape {
                    *escape = false;
                } else if c == '\\' {
                    *escape = true;
                } else if c == '"' {
                    let Ok(key) = serde_json::from_str::<String>(raw) else {
                        return Feed::Error;
                    };
                    let slot = self.slot_for(&key);
                    self.pos = Pos::Colon(slot);
                }
                Feed::Structural
            }
            Pos::Colon(slot) => match c {
                c if is_json_ws(c) => Feed::Structural,
                ':' => {
                    self.pos = Pos::ValueStart(*slot);
                    Feed::Structural
                }
                _ => Feed::Error,
            },
            Pos::ValueStart(slot) => {
                let slot = *slot;
                if is_json_ws(c) {
                    return Feed::Structural;
                }
                if slot == Slot::Name && c != '"' {
                    return Feed::Error;
                }
                let mut scan = ValueScanner::default();
                if scan.feed(c) != Step::More {
                    return Feed::Error;
                }
                let raw = if slot == Slot::Name { c.to_string() } else { String::new() };
                self.pos = Pos::Value { slot, scan, raw };
                if slot == Slot::Args { Feed::Args } else { Feed::Structural }
            }
            Pos::Value { slot, scan, raw } => {
                let slot = *slot;
                match scan.feed(c) {
                    Step::More => {
                        if slot == Slot::Name {
                            raw.push(c);
                        }
                        if slot == Slot::Args { Feed::Args } else { Feed::Structural }
                    }
                    Step::Done => match slot {
                        Slot::Name => {
                            raw.push(c);
                            match serde_json::from_str::<String>(raw) {
                                Ok(name) if !name.is_empty() => {
                                    self.pos = Pos::AfterValue;
                                    Feed::Name(name)
                                }
                                _ => Feed::Error,
                            }
                        }
                        Slot::Args => {
                            self.pos = Pos::AfterValue;
                            Feed::Args
                        }
                        Slot::Skip => {
                            self.pos = Pos::AfterValue;
                            Feed::Structural
                        }
                    },
                    Step::DoneBefore => {
                        self.pos = Pos::AfterValue;
                        self.feed(c)
                    }
                    Step::Error => Feed::Error,
                }
            }
            Pos::AfterValue => match c {
                c if is_json_ws(c) => Feed::Structural,
                ',' => {
                    self.pos = Pos::Key;
                    Feed::Structural
                }
                '}' => {
                    self.pos = Pos::Closed;
                    Feed::End
                }
                _ => Feed::Error,
            },
            Pos::Closed => Feed::Error,
        }
    }

    fn slot_for(&mut self, key: &str) -> Slot {
        match key {
            "name" if !self.have_name => {
                self.have_name = true;
                Slot::Name
            }
            "arguments" | "parameters" if !self.have_args => {
                self.have_args = true;
                Slot::Args
            }
            _ => Slot::Skip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `s`; returns (name, args text, index of End or Error, whether it was an error).
    fn run(s: &str) -> (Option<String>, String, Option<(usize, bool)>) {
        let mut scan = ObjectScanner::default();
        let (mut name, mut args) = (None, String::new());
        for (i, c) in s.char_indices() {
            match scan.feed(c) {
                Feed::Structural => {}
                Feed::Args => args.push(c),
                Feed::Name(n) => name = Some(n),
                Feed::End => return (name, args, Some((i, false))),
                Feed::Error => return (name, args, Some((i, true))),
            }
        }
        (name, args, None)
    }

    #[test]
    fn plain_call() {
        let s = r#" {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, {"x": "}"}]}}"#;
        let (name, args, end) = run(s);
        assert_eq!(name.as_deref(), Some("get_weather"));
        assert_eq!(args, r#"{"city": "Paris", "n": [1, {"x": "}"}]}"#);
        assert_eq!(end, Some((s.len() - 1, false)));
    }

    #[test]
    fn string_and_primitive_arguments() {
        let (_, args, end) = run(r#"{"arguments": "{\"a\": 1}", "name": "f"}"#);
        assert_eq!(args, r#""{\"a\": 1}""#);
        assert_eq!(end.map(|e| e.1), Some(false));
        let (name, args, end) = run(r#"{"name":"f","parameters":-1.5e3}"#);
        assert_eq!((name.as_deref(), args.as_str()), (Some("f"), "-1.5e3"));
        assert_eq!(end.map(|e| e.1), Some(false));
    }

    #[test]
    fn escaped_name_and_skipped_keys() {
        let (name, args, _) =
            run(r#"{"type": "function", "name": "a\u0062c", "name": 5, "arguments": {}, "arguments": [1]}"#);
        assert_eq!(name.as_deref(), Some("abc"));
        assert_eq!(args, "{}");
    }

    #[test]
    fn errors() {
        assert_eq!(run("not json").2, Some((0, true)));
        assert_eq!(run(r#"{"name": 5}"#).2, Some((9, true)));
        assert_eq!(run(r#"{"name": ""}"#).2, Some((10, true)));
        assert_eq!(run(r#"{"name": "f", "arguments": {"a": [1}}"#).2, Some((35, true)));
        assert_eq!(run(r#"{"name": "f", "arguments": {"a": 1</"#).2, Some((34, true)));
        assert_eq!(run(r#"{"name": "f"} x"#).2, Some((12, false)));
    }
}
