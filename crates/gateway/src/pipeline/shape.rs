//! Checks that a request body is a JSON object with the fields its route
//! requires, without building a JSON tree: when the policy needs nothing from
//! the body (round robin and the other load policies without KV events), this
//! is all the parsing a request gets. Same verdicts and messages as checking a
//! parsed `serde_json::Value`; duplicate keys are accepted, the last one wins.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a required field holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Kind {
    #[default]
    Absent,
    Array,
    Other,
}

/// The fields some route requires.
#[derive(Debug, Default)]
struct Shape {
    messages: Kind,
    prompt: Kind,
    text: Kind,
    input_ids: Kind,
}

/// Which route's requirements to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Required {
    /// `messages` must be an array.
    Messages,
    /// `prompt` must be present.
    Prompt,
    /// `text` or `input_ids` must be present.
    TextOrIds,
    /// Any JSON object (the routes passed through without a prompt: embeddings, rerank, classify).
    Object,
}

/// Why a body was refused: the message for a 400.
pub(crate) fn check(bytes: &[u8], required: Required) -> Result<(), String> {
    let shape = match serde_json::from_slice::<Probed>(bytes) {
        Ok(Probed { shape: Some(s), .. }) => s,
        Ok(_) => return Err("the body must be a JSON object".into()),
        Err(e) => return Err(format!("invalid JSON body: {e}")),
    };
    match required {
        Required::Messages if shape.messages != Kind::Array => Err("`messages` must be an array".into()),
        Required::Prompt if shape.prompt == Kind::Absent => Err("`prompt` is required".into()),
        Required::TextOrIds if shape.text == Kind::Absent && shape.input_ids == Kind::Absent => {
            Err("`/generate` needs `text` or `input_ids`".into())
        }
        _ => Ok(()),
    }
}

/// A JSON value's kind, its content skipped; for the top-level value, also
/// the kinds of the required fields when it is an object.
struct Probed {
    kind: Kind,
    shape: Option<Shape>,
}

/// Probes one value: `top` collects the object's required fields, a nested value is only skipped.
struct Probe {
    top: bool,
}

impl<'de> de::Deserialize<'de> for Probed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Probe { top: true })
    }
}

/// A field's value: its kind only.
struct Nested(Kind);

impl<'de> de::Deserialize<'de> for Nested {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Probe { top: false }).map(|p| Nested(p.kind))
    }
}

impl Probe {
    fn other<E>(self) -> Result<Probed, E> {
        Ok(Probed { kind: Kind::Other, shape: None })
    }
}

impl<'de> Visitor<'de> for Probe {
    type Value = Probed;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probed, A::Error> {
        if !self.top {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return self.other();
        }
        let mut shape = Shape::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let slot = match key.as_ref() {
                "messages" => &mut shape.messages,
                "prompt" => &mut shape.prompt,
                "text" => &mut shape.text,
                "input_ids" => &mut shape.input_ids,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value::<Nested>()?.0;
        }
        Ok(Probed { kind: Kind::Other, shape: Some(shape) })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probed, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Probed { kind: Kind::Array, shape: None })
    }

    fn visit_bool<E>(self, _: bool) -> Result<Probed, E> {
        self.other()
    }
    fn visit_i64<E>(self, _: i64) -> Result<Probed, E> {
        self.other()
    }
    fn visit_u64<E>(self, _: u64) -> Result<Probed, E> {
        self.other()
    }
    fn visit_f64<E>(self, _: f64) -> Result<Probed, E> {
        self.other()
    }
    fn visit_str<E>(self, _: &str) -> Result<Probed, E> {
        self.other()
    }
    fn visit_unit<E>(self) -> Result<Probed, E> {
        self.other()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The verdict of checking a parsed `Value`, as the full path does.
    fn by_value(bytes: &[u8], required: Required) -> Result<(), String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON body: {e}"))?;
        if !v.is_object() {
            return Err("the body must be a JSON object".into());
        }
        match required {
            Required::Messages if v.get("messages").and_then(Value::as_array).is_none() => {
                Err("`messages` must be an array".into())
            }
            Required::Prompt if v.get("prompt").is_none() => Err("`prompt` is required".into()),
            Required::TextOrIds if v.get("text").is_none() && v.get("input_ids").is_none() => {
                Err("`/generate` needs `text` or `input_ids`".into())
            }
            _ => Ok(()),
        }
    }

    #[test]
    fn agrees_with_checking_a_parsed_value() {
        let bodies = [
            r#"{"messages": [{"role": "user", "content": "hi"}], "stream": true}"#,
            r#"{"messages": "hi"}"#,
            r#"{"messages": null}"#,
            r#"{"model": "m"}"#,
            r#"{"prompt": null}"#,
            r#"{"prompt": [1, 2, 3], "max_tokens": 4}"#,
            r#"{"text": "x"}"#,
            r#"{"input_ids": [[1], [2]], "sampling_params": {"a": {"b": [1, {"c": null}]}}}"#,
            r#"{"messages": 1, "messages": [{"content": "the last one wins"}]}"#,
            r#"{"me\u0073sages": []}"#,
            r#"  {"messages": []}  "#,
            "[1, 2]",
            "\"a string\"",
            "42",
            "null",
            "true",
            "",
            "{",
            r#"{"messages": [}"#,
            r#"{"messages": []} trailing"#,
            "{\"bad\": \"\\x\"}",
        ];
        for body in bodies {
            for required in [Required::Messages, Required::Prompt, Required::TextOrIds] {
                let fast = check(body.as_bytes(), required);
                let slow = by_value(body.as_bytes(), required);
                assert_eq!(fast.is_ok(), slow.is_ok(), "{body:?} {required:?}: {fast:?} vs {slow:?}");
                // Same message, except that serde's error position text is shared by both paths.
                assert_eq!(fast, slow, "{body:?} {required:?}");
            }
        }
    }
}
