//! Python-compatible text forms of template values: `json.dumps` (what HF's
//! `tojson` filter calls, non-ASCII kept, `", "`/`": "` separators) and `repr`
//! (what Jinja2 prints for a list, dict, bool or None).
//!
//! Templates print tool schemas with `tojson`; one separator or escape that
//! differs from Python changes the prompt and every block hash after it.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};

/// Options of `json.dumps` that HF's `tojson` exposes.
#[derive(Debug, Clone)]
pub(crate) struct DumpOptions {
    pub(crate) indent: Option<String>,
    pub(crate) item_sep: String,
    pub(crate) key_sep: String,
    pub(crate) sort_keys: bool,
    pub(crate) ensure_ascii: bool,
}

// === impl DumpOptions ===

impl DumpOptions {
    /// Python's defaults for the given indent: `", "` without indent, `","` with one.
    pub(crate) fn new(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " }.to_string();
        Self { indent, item_sep, key_sep: ": ".to_string(), sort_keys: false, ensure_ascii: false }
    }
}

/// `json.dumps(value, **opts)`; errors on values JSON cannot represent.
pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, String> {
    let mut out = String::new();
    dump_into(&mut out, value, opts, 0)?;
    Ok(out)
}

fn newline(out: &mut String, opts: &DumpOptions, depth: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn dump_into(out: &mut String, value: &Value, opts: &DumpOptions, depth: usize) -> Result<(), String> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => {
            return Err("Object of type Undefined is not JSON serializable".into());
        }
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true),
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                dump_into(out, item, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort_by_key(key_string);
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                write_json_str(out, &key_string(key), opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                let item = value.get_item(key).map_err(|e| e.to_string())?;
                dump_into(out, &item, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push('}');
        }
        other => return Err(format!("Object of type {other} is not JSON serializable")),
    }
    Ok(())
}

/// JSON object keys as Python coerces them (`True` → `"true"`, `1` → `"1"`).
fn key_string(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, true);
            s
        }
        _ => key.to_string(),
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
            c if ensure_ascii && !c.is_ascii() => {
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

/// Writes a number the way Python prints it (`json.dumps` when `json`, else `repr`).
fn write_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) => out.push_str(&py_float(f, json)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below
/// 1e-4 and from 1e16 on, always a `.0` or exponent so it reads back as float.
pub(crate) fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.to_string() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // `{:e}` gives the shortest round-trip digits: "1.2345e-7", "1e16".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let frac = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{frac}e{esign}{:02}", exp.abs())
    }
}

/// Python's `repr` of a string: single quotes unless the text holds a single
/// quote and no double quote.
fn py_repr_str(out: &mut String, s: &str) {
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
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str()` of a value, as Jinja2 prints `{{ value }}`.
pub(crate) fn py_str(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::Undefined => {}
        _ => py_repr(out, value),
    }
}

/// Python's `repr()` of a value (strings quoted, `True`, `None`, `{'k': v}`).
pub(crate) fn py_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Undefined => {}
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false),
        ValueKind::String => py_repr_str(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key);
                    out.push_str(": ");
                    if let Ok(item) = value.get_item(&key) {
                        py_repr(out, &item);
                    }
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Value {
        Value::from(minijinja::value::Serde(serde_json::from_str::<serde_json::Value>(json).unwrap()))
    }

    #[test]
    fn dumps_matches_python_defaults() {
        let value = v(r#"{"name":"get_weather","args":{"city":"Zürich","n":[1,2.5,true,null]},"e":{},"l":[]}"#);
        assert_eq!(
            dumps(&value, &DumpOptions::new(None)).unwrap(),
            r#"{"name": "get_weather", "args": {"city": "Zürich", "n": [1, 2.5, true, null]}, "e": {}, "l": []}"#
        );
    }

    #[test]
    fn dumps_indent_and_escapes() {
        let value = v(r#"{"a":["x\n\"y\"","<tag>&"],"b":1}"#);
        assert_eq!(
            dumps(&value, &DumpOptions::new(Some("  ".into()))).unwrap(),
            "{\n  \"a\": [\n    \"x\\n\\\"y\\\"\",\n    \"<tag>&\"\n  ],\n  \"b\": 1\n}"
        );
        let mut ascii = DumpOptions::new(None);
        ascii.ensure_ascii = true;
        assert_eq!(dumps(&v(r#""é😀""#), &ascii).unwrap(), r#""\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn floats_print_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (123456.789, "123456.789"),
            (-2.5, "-2.5"),
            (1e-4, "0.0001"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(py_float(f, true), s, "{f}");
        }
    }

    #[test]
    fn repr_matches_python() {
        let mut out = String::new();
        py_repr(&mut out, &v(r#"[{"type":"text","text":"it's"},true,null,"a'b\"c"]"#));
        assert_eq!(out, r#"[{'type': 'text', 'text': "it's"}, True, None, 'a\'b"c']"#);
    }
}
