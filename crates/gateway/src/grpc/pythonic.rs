//! The `pythonic` tool-call format (Llama 4 and others), as SGLang 0.5.23's
//! `PythonicDetector` reads it: the calls a Python list of calls with keyword
//! arguments, `[f(a=1), g(b="x")]`, found by the detector's own regex and read
//! as Python reads it (`ast.parse`), each argument a literal: a string in any
//! of Python's forms, a number, `True`/`False`/`None`, a list or a dict of
//! them. A call with an argument that is not such a literal is dropped, the
//! others kept; a list Python cannot read, or that is not a list of calls,
//! gives no call. The text around the list is the answer's content.
//!
//! Where SGLang drops a call whose argument is a signed number (`-1`, a unary
//! minus to Python), a tuple or a set, or JSON's `true`/`false`/`null`, the
//! router reads it as vLLM 0.33's `PythonicToolParser` does (a number, a list
//! in the order written, the value): `delta=-2` is a common argument, not a
//! reason to lose the call (`tests/fixtures/vllm_parsers`).
//!
//! Where this reading is narrower than Python's: an integer beyond 64 bits,
//! a `\N{...}` escape and a lone surrogate make their call dropped (Python
//! keeps it), and an argument Python would refuse as a syntax error but whose
//! brackets and quotes balance drops only its own call (Python: every call).

use std::sync::LazyLock;

use serde_json::{Map, Number, Value};

/// `PythonicDetector.tool_call_regex` (`re.DOTALL`).
static CALLS: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r"(?s)\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    )
    .expect("the detector's pattern")
});

/// A string literal's prefixes (any case), none included.
const PREFIXES: [&str; 9] = ["", "r", "u", "b", "f", "br", "rb", "fr", "rf"];

/// Whether the failed literal at the start of `text` is a constant all the same (bytes, a
/// complex number): the detector can read a dict key's `value` from it.
fn constant(text: &[u8]) -> bool {
    let prefix = text.iter().take_while(|b| b.is_ascii_alphabetic()).count();
    let quoted = matches!(text.get(prefix), Some(b'"' | b'\''));
    let prefix = String::from_utf8_lossy(&text[..prefix]).to_ascii_lowercase();
    text.first().is_some_and(|b| b.is_ascii_digit() || *b == b'.')
        || (quoted && prefix.contains('b') && !prefix.contains('f'))
}

/// The answer's content and its calls' objects (`{"name", "arguments"}`).
pub(crate) fn pythonic(text: &str) -> (String, Vec<Value>) {
    let text = text.trim().replace("<|python_start|>", "").replace("<|python_end|>", "");
    let Some(m) = CALLS.find(&text) else { return (text, Vec::new()) };
    let content = format!("{}{}", &text[..m.start()], &text[m.end()..]);
    (content, Reader { s: m.as_str().as_bytes(), at: 0, later: false }.calls().unwrap_or_default())
}

/// `-n`: an integer's negation (`None` beyond 64 bits), a float's.
fn negated(n: &Number) -> Option<Value> {
    if let Some(u) = n.as_u64() {
        return 0i64.checked_sub_unsigned(u).map(|i| Value::Number(i.into()));
    }
    if let Some(i) = n.as_i64() {
        return Some(Value::Number(i.unsigned_abs().into())); // negative here: `--3`
    }
    n.as_f64().and_then(|f| Number::from_f64(-f)).map(Value::Number)
}

/// Why an expression has no value here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    /// Python would not read the list: no call at all.
    Whole,
    /// Reading the value fails where the detector does not expect it (a dict key that is not
    /// a constant: `key.value`): no call at all, if the value is read.
    Outer,
    /// A valid expression that is not a literal: its call is dropped.
    Call,
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
    /// A value read has no JSON form (an infinite float, a dict key that is bytes or complex;
    /// here also an integer beyond 64 bits): the call's `json.dumps` will fail.
    later: bool,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.at += usize::from(hit);
        hit
    }

    /// After an item of a bracketed sequence: `Some(false)` past a `,` (more may come),
    /// `Some(true)` past the `close`, `None` for anything else.
    fn next_or_close(&mut self, close: u8) -> Option<bool> {
        self.ws();
        if self.eat(b',') {
            return Some(false);
        }
        self.ws();
        self.eat(close).then_some(true)
    }

    /// Spaces, newlines, comments and line continuations (all inside brackets here).
    fn ws(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => self.at += 1,
                b'\\' if matches!(self.s.get(self.at + 1), Some(b'\n' | b'\r')) => self.at += 2,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.at += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        let text = std::str::from_utf8(&self.s[start..]).ok()?;
        let len = text
            .char_indices()
            .find(|&(i, c)| !(c == '_' || c.is_alphabetic() || (i > 0 && c.is_numeric())))
            .map_or(text.len(), |(i, _)| i);
        self.at += len;
        (len > 0).then(|| text[..len].to_owned())
    }

    /// The list of calls, each call's object or `None` when it is dropped.
    fn calls(&mut self) -> Option<Vec<Value>> {
        self.ws();
        if !self.eat(b'[') {
            return None;
        }
        let mut calls = Vec::new();
        loop {
            self.ws();
            if self.eat(b']') {
                break;
            }
            calls.push(self.call().ok()?);
            if self.next_or_close(b']')? {
                break;
            }
        }
        self.ws();
        // Anything after the list makes it part of a larger expression, or not Python.
        (self.at == self.s.len()).then(|| calls.into_iter().flatten().collect())
    }

    /// One element: a call by a plain name (`None` when its arguments drop it), or a call by
    /// another name (dropped); anything else fails the whole list.
    fn call(&mut self) -> Result<Option<Value>, Fail> {
        let name = self.name().ok_or(Fail::Whole)?;
        let mut plain = true;
        while self.eat(b'.') {
            self.name().ok_or(Fail::Whole)?;
            plain = false;
        }
        self.ws();
        if !self.eat(b'(') {
            return Err(Fail::Whole);
        }
        // Python reads every argument; the detector then converts the keyword ones in order and
        // stops at the first that fails.
        let (mut arguments, mut stopped, mut keywords) = (Map::new(), false, false);
        self.later = false;
        loop {
            self.ws();
            if self.eat(b')') {
                break;
            }
            let key = if self.s[self.at..].starts_with(b"**") {
                self.at += 2;
                keywords = true;
                Some("null".to_owned())
            } else if self.eat(b'*') {
                None
            } else {
                let start = self.at;
                match self.name() {
                    Some(k) if self.peek() == Some(b'=') && self.s.get(self.at + 1) != Some(&b'=') => {
                        self.at += 1;
                        keywords = true;
                        Some(k)
                    }
                    _ => {
                        self.at = start;
                        // A positional argument after a keyword one is a syntax error.
                        if keywords {
                            return Err(Fail::Whole);
                        }
                        None
                    }
                }
            };
            self.ws();
            let later = self.later;
            let value = self.argument()?;
            match key {
                // Positional arguments are never converted, nor those after a failed one.
                None => self.later = later,
                Some(_) if stopped => self.later = later,
                Some(k) => match value {
                    Ok(v) => {
                        arguments.insert(k, v);
                    }
                    Err(Fail::Call) => stopped = true,
                    Err(_) => return Err(Fail::Whole),
                },
            }
            if self.next_or_close(b')').ok_or(Fail::Whole)? {
                break;
            }
        }
        let kept = plain && !stopped && !self.later;
        Ok(kept.then(|| serde_json::json!({"name": name, "arguments": arguments})))
    }

    /// An argument up to the next `,` or `)`: `Err` when Python would not read it, else its
    /// value or why converting it fails.
    fn argument(&mut self) -> Result<Result<Value, Fail>, Fail> {
        let start = self.at;
        self.skip_expr()?;
        let end = self.at;
        let mut inner = Reader { s: &self.s[..end], at: start, later: false };
        let got = inner.literal();
        inner.ws();
        let whole = inner.at == end;
        match got {
            // The literal is the whole argument, or only its start (then not a literal).
            Ok(v) if whole => {
                self.later |= inner.later;
                Ok(Ok(v))
            }
            Ok(_) => Ok(Err(Fail::Call)),
            Err(Fail::Whole) => Err(Fail::Whole),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Past an expression whose brackets and quotes balance, up to a `,` or `)` outside them.
    fn skip_expr(&mut self) -> Result<(), Fail> {
        let mut depth = 0usize;
        let start = self.at;
        while let Some(b) = self.peek() {
            match b {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' if depth == 0 => break,
                b')' | b']' | b'}' => depth -= 1,
                b',' if depth == 0 => break,
                b'\'' | b'"' => {
                    self.string_body(true).map_err(|_| Fail::Whole)?;
                    continue;
                }
                _ => {}
            }
            self.at += 1;
        }
        let text = &self.s[start..self.at];
        if depth != 0 || text.iter().all(u8::is_ascii_whitespace) { Err(Fail::Whole) } else { Ok(()) }
    }

    /// A literal: `Fail::Call` for a valid expression that is not one (or has no JSON form).
    fn literal(&mut self) -> Result<Value, Fail> {
        self.ws();
        match self.peek().ok_or(Fail::Whole)? {
            b'"' | b'\'' => self.strings(false, false),
            b'0'..=b'9' | b'.' => self.number(),
            b'[' => {
                self.at += 1;
                self.items(Vec::new(), b']')
            }
            b'{' => self.dict(),
            b'(' => {
                self.at += 1;
                self.ws();
                if self.eat(b')') {
                    return Ok(Value::Array(Vec::new())); // `()`, an empty tuple
                }
                let inner = self.literal()?;
                match self.next_or_close(b')').ok_or(Fail::Call)? {
                    true => Ok(inner),
                    // A tuple: a list in JSON (vLLM's reading).
                    false => self.items(vec![inner], b')'),
                }
            }
            // A signed number (vLLM's reading: `-1` is a unary minus over a constant to Python).
            sign @ (b'-' | b'+') => {
                self.at += 1;
                match self.literal()? {
                    Value::Number(n) if sign == b'+' => Ok(Value::Number(n)),
                    Value::Number(n) => Ok(negated(&n).unwrap_or_else(|| self.unjsonable())),
                    _ => Err(Fail::Call),
                }
            }
            _ => {
                let name = self.name().ok_or(Fail::Call)?;
                let lower = name.to_ascii_lowercase();
                match name.as_str() {
                    // Python's names, and JSON's that models also write (vLLM reads both).
                    "True" | "true" => Ok(Value::Bool(true)),
                    "False" | "false" => Ok(Value::Bool(false)),
                    "None" | "null" => Ok(Value::Null),
                    _ if matches!(self.peek(), Some(b'"' | b'\'')) && PREFIXES.contains(&lower.as_str()) => {
                        self.strings(lower.contains('r'), lower.contains('b') || lower.contains('f'))
                    }
                    _ => Err(Fail::Call),
                }
            }
        }
    }

    /// The rest of a list, a tuple or a set up to its `close`, after the `items` read.
    fn items(&mut self, mut items: Vec<Value>, close: u8) -> Result<Value, Fail> {
        loop {
            self.ws();
            if self.eat(close) {
                return Ok(Value::Array(items));
            }
            items.push(self.literal()?);
            if self.next_or_close(close).ok_or(Fail::Call)? {
                return Ok(Value::Array(items));
            }
        }
    }

    /// A dict of literals, its keys constants; or a set, a list in JSON in the order written
    /// (vLLM's reading).
    fn dict(&mut self) -> Result<Value, Fail> {
        self.at += 1;
        let mut map = Map::new();
        loop {
            self.ws();
            if self.eat(b'}') {
                return Ok(Value::Object(map));
            }
            // The detector reads `key.value`, which only a constant has (`**x` has no key).
            if self.s[self.at..].starts_with(b"**") {
                return Err(Fail::Outer);
            }
            let start = self.at;
            let read = self.literal();
            self.ws();
            // A first item that no `:` follows: a set.
            if map.is_empty() && matches!(self.peek(), Some(b',' | b'}')) && read.is_ok() {
                self.eat(b',');
                return self.items(vec![read?], b'}');
            }
            let key = match read {
                Ok(k @ (Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null)) => k,
                Ok(_) | Err(Fail::Outer) => return Err(Fail::Outer),
                Err(Fail::Whole) => return Err(Fail::Whole),
                // Bytes and complex numbers are constants: `json.dumps` refuses them as keys.
                Err(Fail::Call) if constant(&self.s[start..]) => {
                    self.later = true;
                    Value::Null
                }
                Err(Fail::Call) => return Err(Fail::Outer),
            };
            match self.peek() {
                Some(b':') => self.at += 1,
                Some(b',' | b'}') => return Err(Fail::Call), // a set of what is no literal
                _ => return Err(Fail::Outer),                // a key that is an expression
            }
            let value = self.literal()?;
            let key = match key {
                Value::String(s) => s,
                Value::Null => "null".to_owned(),
                other => renderer::python_json(&other, false),
            };
            map.insert(key, value);
            if self.next_or_close(b'}').ok_or(Fail::Call)? {
                return Ok(Value::Object(map));
            }
        }
    }

    /// A number: an int (64 bits here), a float, never an imaginary one.
    fn number(&mut self) -> Result<Value, Fail> {
        let start = self.at;
        let radix = match (self.peek(), self.s.get(self.at + 1).map(u8::to_ascii_lowercase)) {
            (Some(b'0'), Some(b'x')) => 16,
            (Some(b'0'), Some(b'o')) => 8,
            (Some(b'0'), Some(b'b')) => 2,
            _ => 10,
        };
        if radix != 10 {
            self.at += 2;
            let digits = self.run(|b| b.is_ascii_hexdigit() || b == b'_');
            return Ok(self.int(u64::from_str_radix(&digits.replace('_', ""), radix).ok()));
        }
        let mut float = false;
        let int_part = self.run(|b| b.is_ascii_digit() || b == b'_');
        if self.peek() == Some(b'.') {
            float = true;
            self.at += 1;
            self.run(|b| b.is_ascii_digit() || b == b'_');
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            float = true;
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.run(|b| b.is_ascii_digit() || b == b'_');
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).map_err(|_| Fail::Whole)?.replace('_', "");
        if matches!(self.peek(), Some(b'j' | b'J')) {
            self.at += 1;
            return Err(Fail::Call); // complex
        }
        if text == "." {
            return Err(Fail::Whole);
        }
        if !float {
            // Python reads `00` but not `01`.
            if int_part.len() > 1 && int_part.starts_with('0') && int_part.bytes().any(|b| b != b'0' && b != b'_') {
                return Err(Fail::Whole);
            }
            return Ok(self.int(text.parse::<u64>().ok()));
        }
        let f: f64 = text.parse().map_err(|_| Fail::Whole)?;
        // An infinite float is read; `json.dumps` refuses it.
        Ok(Number::from_f64(f).filter(|_| f.is_finite()).map_or_else(|| self.unjsonable(), Value::Number))
    }

    /// An integer's value; beyond 64 bits its call is dropped here (Python would keep it).
    fn int(&mut self, n: Option<u64>) -> Value {
        n.map_or_else(|| self.unjsonable(), |n| Value::Number(n.into()))
    }

    /// A value with no JSON form: its call's `json.dumps` fails.
    fn unjsonable(&mut self) -> Value {
        self.later = true;
        Value::Null
    }

    fn run(&mut self, keep: impl Fn(u8) -> bool) -> String {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).into_owned()
    }

    /// One string literal and those right after it (Python joins them); `raw` and `other`
    /// (bytes or an f-string: not a literal here) are the first one's prefix.
    fn strings(&mut self, mut raw: bool, other: bool) -> Result<Value, Fail> {
        let (mut text, mut no_form) = (String::new(), other);
        loop {
            match self.string_body(raw) {
                Ok(Some(s)) => text.push_str(&s),
                Ok(None) => no_form = true,
                Err(()) => return Err(Fail::Whole),
            }
            let save = self.at;
            self.ws();
            let prefix = self.name().map(|n| n.to_ascii_lowercase()).unwrap_or_default();
            if matches!(self.peek(), Some(b'"' | b'\'')) && PREFIXES.contains(&prefix.as_str()) {
                raw = prefix.contains('r');
                no_form |= prefix.contains('b') || prefix.contains('f');
                continue;
            }
            self.at = save;
            return if no_form { Err(Fail::Call) } else { Ok(Value::String(text)) };
        }
    }

    /// One quoted body at the cursor: its text (`None`: an escape with no value here), or
    /// `Err` when it does not end.
    fn string_body(&mut self, raw: bool) -> Result<Option<String>, ()> {
        let q = self.peek().ok_or(())?;
        let triple = self.s[self.at..].starts_with(&[q, q, q]);
        self.at += if triple { 3 } else { 1 };
        let mut out = String::new();
        let mut ok = true;
        loop {
            let rest = std::str::from_utf8(&self.s[self.at..]).map_err(|_| ())?;
            let c = rest.chars().next().ok_or(())?;
            if c as u32 == u32::from(q) && (!triple || self.s[self.at..].starts_with(&[q, q, q])) {
                self.at += if triple { 3 } else { 1 };
                return Ok(ok.then_some(out));
            }
            if c == '\n' && !triple {
                return Err(());
            }
            self.at += c.len_utf8();
            if c != '\\' {
                out.push(c);
                continue;
            }
            let e = std::str::from_utf8(&self.s[self.at..]).map_err(|_| ())?.chars().next().ok_or(())?;
            if raw {
                out.push('\\');
                out.push(e);
                self.at += e.len_utf8();
                continue;
            }
            self.at += e.len_utf8();
            match e {
                '\n' => {}
                '\\' | '\'' | '"' => out.push(e),
                'a' => out.push('\x07'),
                'b' => out.push('\x08'),
                'f' => out.push('\x0c'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'v' => out.push('\x0b'),
                '0'..='7' => {
                    let mut n = e.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match self.peek().and_then(|b| char::from(b).to_digit(8)) {
                            Some(d) => {
                                n = n * 8 + d;
                                self.at += 1;
                            }
                            None => break,
                        }
                    }
                    out.push(char::from_u32(n).ok_or(())?);
                }
                'x' | 'u' | 'U' => {
                    let len = match e {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let hex = self.s.get(self.at..self.at + len).ok_or(())?;
                    let hex = std::str::from_utf8(hex).map_err(|_| ())?;
                    let n = u32::from_str_radix(hex, 16).map_err(|_| ())?;
                    self.at += len;
                    // A lone surrogate has no UTF-8 form.
                    match char::from_u32(n) {
                        Some(c) => out.push(c),
                        None => ok = false,
                    }
                }
                // `\N{...}`: a character by its name.
                'N' => ok = false,
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one call's arguments, or `None` when it is dropped.
    fn arguments(call: &str) -> Option<Value> {
        let (_, calls) = pythonic(&format!("[f({call}), g()]"));
        (calls.len() == 2).then(|| calls[0]["arguments"].clone())
    }

    #[test]
    fn signed_numbers_tuples_sets_and_json_names_are_read_as_vllm_reads_them() {
        let read = |call: &str| arguments(call).map(|a| a.to_string());
        assert_eq!(
            read("a=-1, b=+2, c=-1.5, d=--3, e=- 4").as_deref(),
            Some(r#"{"a":-1,"b":2,"c":-1.5,"d":3,"e":-4}"#)
        );
        assert_eq!(read("a=-9223372036854775808").as_deref(), Some(r#"{"a":-9223372036854775808}"#));
        assert_eq!(
            read("a=(), b=(1,), c=(1, 'x', [2]), d=(3)").as_deref(),
            Some(r#"{"a":[],"b":[1],"c":[1,"x",[2]],"d":3}"#)
        );
        assert_eq!(read("a={'z', 'y'}, b={}, c={1: {2}}").as_deref(), Some(r#"{"a":["z","y"],"b":{},"c":{"1":[2]}}"#));
        assert_eq!(read("a=null, b=true, c=false").as_deref(), Some(r#"{"a":null,"b":true,"c":false}"#));
        // Still not literals: a sign over anything but a number, a number past 64 bits signed.
        for dropped in ["a=-True", "a=-'x'", "a=-x", "a=-18446744073709551615", "a=-1e999", "a=(x, 1)", "a={x}"] {
            assert_eq!(read(dropped), None, "{dropped}");
        }
    }
}
