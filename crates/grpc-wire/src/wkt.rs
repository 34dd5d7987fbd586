//! Protobuf's well-known types the services here carry (`google/protobuf/struct.proto`):
//! `Struct`, `Value`, `ListValue`, with helpers to build and read them.

use std::collections::BTreeMap;

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `NullValue` (an enum of one value, 0).
    #[prost(int32, tag = "1")]
    Null(i32),
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    String(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "5")]
    Struct(Struct),
    #[prost(message, tag = "6")]
    List(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    /// A string value.
    pub fn string(s: impl Into<String>) -> Self {
        Self { kind: Some(Kind::String(s.into())) }
    }
}

impl Value {
    /// A number.
    pub fn number(n: f64) -> Self {
        Self { kind: Some(Kind::Number(n)) }
    }

    /// A boolean.
    pub fn bool(b: bool) -> Self {
        Self { kind: Some(Kind::Bool(b)) }
    }

    /// The number it holds, if it holds one.
    pub fn as_f64(&self) -> Option<f64> {
        match self.kind {
            Some(Kind::Number(n)) => Some(n),
            _ => None,
        }
    }

    /// The string it holds, if it holds one.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(Kind::String(s)) => Some(s),
            _ => None,
        }
    }
}
