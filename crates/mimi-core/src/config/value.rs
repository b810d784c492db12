//! The dynamic [`Value`] a config field is read from (a Python keyword argument, a JSON
//! value), and how each field type reads and writes it ([`Field`]).

use crate::error::{Error, Result};

/// A dynamic value, as a Python keyword argument or a JSON value holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    /// Ordered key/value pairs.
    Dict(Vec<(String, Value)>),
    /// Anything else, kept for messages: its type name and `repr`.
    Other {
        type_name: String,
        repr: String,
    },
}

impl Value {
    /// The value as a literal, for messages (JSON's notation: `null`, `true`, `"text"`,
    /// `[1, 2]`, `{"k": 1}`); a value the caller could not map keeps the caller's own text.
    pub fn literal(&self) -> String {
        match self {
            Value::None => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) if f.is_nan() => "nan".into(),
            Value::Float(f) if f.is_infinite() => (if *f > 0.0 { "inf" } else { "-inf" }).into(),
            Value::Float(f) => format!("{f:?}"),
            Value::Str(s) => format!("{s:?}"),
            Value::List(l) => format!("[{}]", join(l.iter().map(Value::literal))),
            Value::Dict(d) => format!(
                "{{{}}}",
                join(d.iter().map(|(k, v)| format!("{k:?}: {}", v.literal())))
            ),
            Value::Other { repr, .. } => repr.clone(),
        }
    }

    /// The value and its kind, for messages: `1.5 (float)`.
    pub fn describe(&self) -> String {
        let ty = match self {
            Value::None => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Other { type_name, .. } => type_name,
        };
        format!("{} ({ty})", self.literal())
    }

    /// The entry `key` of a dict, `None` if absent or not a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(d) => d.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

pub(super) fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// A config field's type: how it is read from a [`Value`] and written back.
pub trait Field: Sized {
    /// Reads the field `field` from `v`, or a [`Error::Config`] naming it.
    fn parse(field: &str, v: &Value) -> Result<Self>;
    /// The field as a value.
    fn value(&self) -> Value;
}

impl Field for usize {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Int(i) => usize::try_from(*i).map_err(|_| {
                Error::config(
                    field,
                    format!("expected a non-negative int that fits in 64 bits, got {i}"),
                )
            }),
            _ => Err(Error::config(
                field,
                format!("expected an int, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Int(*self as i128)
    }
}

impl Field for u64 {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        usize::parse(field, v).map(|s| s as u64)
    }
    fn value(&self) -> Value {
        Value::Int(*self as i128)
    }
}

impl Field for bool {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Bool(b) => Ok(*b),
            _ => Err(Error::config(
                field,
                format!("expected a bool, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl Field for f64 {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            _ => Err(Error::config(
                field,
                format!("expected a number, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::Float(*self)
    }
}

impl<T: Field> Field for Option<T> {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::None => Ok(None),
            v => T::parse(field, v).map(Some),
        }
    }
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::None, Field::value)
    }
}

impl Field for Vec<usize> {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::List(items) => items.iter().map(|i| usize::parse(field, i)).collect(),
            _ => Err(Error::config(
                field,
                format!("expected a list of ints, got {}", v.describe()),
            )),
        }
    }
    fn value(&self) -> Value {
        Value::List(self.iter().map(Field::value).collect())
    }
}

/// SEANet's activation: ELU with `alpha`, written `{"elu": alpha}` (candle's serde form) or
/// `"elu"` (alpha 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Elu(pub f64);

impl Field for Elu {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        let only = || {
            Error::config(
                field,
                "only the ELU activation ({\"elu\": alpha}) is supported",
            )
        };
        match v {
            Value::Str(s) if s == "elu" => Ok(Elu(1.0)),
            Value::Dict(d) if d.len() == 1 => {
                let alpha = f64::parse(field, v.get("elu").ok_or_else(only)?)?;
                Ok(Elu(positive(field, alpha)?))
            }
            Value::Dict(_) => Err(only()),
            _ => Err(choice_error(field, &["elu"], v)),
        }
    }
    fn value(&self) -> Value {
        Value::Dict(vec![("elu".into(), Value::Float(self.0))])
    }
}

/// A field that only accepts `None` (SEANet's `final_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct NoneOnly;

impl Field for NoneOnly {
    fn parse(field: &str, v: &Value) -> Result<Self> {
        match v {
            Value::None => Ok(NoneOnly),
            _ => Err(Error::config(field, "only None is supported")),
        }
    }
    fn value(&self) -> Value {
        Value::None
    }
}

pub(super) fn positive(field: &str, f: f64) -> Result<f64> {
    if f.is_finite() && f > 0.0 {
        Ok(f)
    } else {
        Err(Error::config(
            field,
            format!("expected a positive finite number, got {f}"),
        ))
    }
}

/// Refuses any of `fields` (name, value) that is zero, naming the first one.
pub(super) fn require_nonzero(fields: &[(&str, usize)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((field, _)) => Err(Error::config(field, "must be at least 1, got 0")),
        None => Ok(()),
    }
}

/// The error of a value that is not one of `names`.
pub(crate) fn choice_error(field: &str, names: &[&str], v: &Value) -> Error {
    let choices = join(names.iter().map(|n| format!("{n:?}")));
    let got = match v {
        Value::Str(s) => format!("{s:?}"),
        v => v.describe(),
    };
    Error::config(field, format!("expected one of {choices}, got {got}"))
}
