//! Python's view of template values: `str()`, `repr()` and `json.dumps()`.
//!
//! transformers renders templates with Jinja2, so every value a template prints goes through
//! Python's `str()`, and its `tojson` filter is `json.dumps`. minijinja formats values its own
//! way (`true`, `[1, 2]`, `{"a": 1}`), so to stay byte-identical we format them as Python would.

use minijinja::value::{Value, ValueKind};
use std::fmt::Write;

/// Formats a value the way Python's `str()` does (strings raw, containers as `repr`).
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(value),
    }
}

/// Formats a value the way Python's `repr()` does.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

fn write_number(out: &mut String, value: &Value) {
    if let Some(i) = value.as_i64()
        && value.is_integer()
    {
        let _ = write!(out, "{i}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) if value.is_integer() => {
            let _ = write!(out, "{f}");
        }
        Ok(f) => out.push_str(&py_float_repr(f)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 and from 1e16.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // `{:e}` gives the shortest round-trip digits as `d.ddde±x`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

fn write_str_repr(out: &mut String, s: &str) {
    // Python prefers single quotes unless the string holds a single quote and no double quote.
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_py_unprintable(c) => {
                let n = c as u32;
                if n <= 0xff {
                    let _ = write!(out, "\\x{n:02x}");
                } else if n <= 0xffff {
                    let _ = write!(out, "\\u{n:04x}");
                } else {
                    let _ = write!(out, "\\U{n:08x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Characters Python's `str.isprintable()` rejects beyond ASCII controls (a close approximation:
/// C1 controls, separators other than the ASCII space, and format characters).
fn is_py_unprintable(c: char) -> bool {
    matches!(c as u32, 0x80..=0xa0 | 0xad | 0x2028 | 0x2029 | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0xfeff)
        || (c.is_whitespace() && c != ' ')
}

/// Python's `str.isspace()`, which also counts the ASCII separators 0x1c-0x1f.
pub fn py_is_space(c: char) -> bool {
    c.is_whitespace() || matches!(c as u32, 0x1c..=0x1f)
}

/// Options of Python's `json.dumps` that chat templates use. The default is transformers'
/// `tojson`, whose `ensure_ascii` is false (unlike `json.dumps`).
#[derive(Debug, Clone, Default)]
pub struct JsonDumpOptions {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Pretty-print with this indent string; `None` for one line.
    pub indent: Option<String>,
    /// Item and key separators; defaults depend on `indent` as in Python.
    pub separators: Option<(String, String)>,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// Serializes a value exactly as `json.dumps(value, **options)` would.
pub fn py_json_dumps(value: &Value, options: &JsonDumpOptions) -> Result<String, String> {
    let (item_sep, key_sep) = match &options.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        None if options.indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let mut out = String::new();
    let writer = JsonWriter { options, item_sep: &item_sep, key_sep: &key_sep };
    writer.write(&mut out, value, 0)?;
    Ok(out)
}

struct JsonWriter<'a> {
    options: &'a JsonDumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(indent) = &self.options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, level: usize) -> Result<(), String> {
        if level > 500 {
            return Err("maximum recursion depth exceeded while encoding a JSON object".into());
        }
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    let _ = write!(out, "{value}");
                } else {
                    let f = f64::try_from(value.clone()).map_err(|e| e.to_string())?;
                    out.push_str(&match py_float_repr(f).as_str() {
                        "nan" => "NaN".to_owned(),
                        "inf" => "Infinity".to_owned(),
                        "-inf" => "-Infinity".to_owned(),
                        other => other.to_owned(),
                    });
                }
            }
            ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), self.options.ensure_ascii),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.options.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    let key_text = match key.kind() {
                        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
                        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
                        ValueKind::None => "null".to_owned(),
                        ValueKind::Number => py_str(key),
                        _ => return Err(format!("keys must be str, int, float, bool or None, not {}", key.kind())),
                    };
                    write_json_str(out, &key_text, self.options.ensure_ascii);
                    out.push_str(self.key_sep);
                    self.write(out, &value.get_item(key).unwrap_or_default(), level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            other => return Err(format!("Object of type {other} is not JSON serializable")),
        }
        Ok(())
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::to_value;

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5, "-2.5"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn repr_matches_python() {
        let v = to_value(serde_json::json!({"a": [1, true, null, "it's"], "b": 0.5, "c": "x\ny"}));
        assert_eq!(py_repr(&v), r#"{'a': [1, True, None, "it's"], 'b': 0.5, 'c': 'x\ny'}"#);
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = to_value(serde_json::json!({"b": [1, 2.0, "é\"</"], "a": {}}));
        assert_eq!(py_json_dumps(&v, &JsonDumpOptions::default()).unwrap(), r#"{"b": [1, 2.0, "é\"</"], "a": {}}"#);
        let opts =
            JsonDumpOptions { ensure_ascii: true, indent: Some("  ".into()), sort_keys: true, ..Default::default() };
        assert_eq!(
            py_json_dumps(&v, &opts).unwrap(),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.0,\n    \"\\u00e9\\\"</\"\n  ]\n}"
        );
    }
}
