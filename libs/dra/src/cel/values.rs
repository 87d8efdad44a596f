//! Quantity and semver values, and Kubernetes' quantity and semver library functions.

use std::sync::Arc;

use cel::objects::Opaque;
use cel::{Context, ExecutionError, FunctionContext, Value};

use crate::quantity::Quantity;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct QuantityValue(Quantity);

impl Opaque for QuantityValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

pub(super) fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(QuantityValue(q)))
}

/// A semantic version as Kubernetes reads version attributes (strict
/// `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`, no leading zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<String>,
}

impl Semver {
    pub fn parse(s: &str) -> Option<Semver> {
        let (core, _build) = s.split_once('+').map_or((s, None), |(c, b)| (c, Some(b)));
        if let Some(b) = _build
            && (b.is_empty()
                || b.split('.').any(|p| {
                    p.is_empty() || !p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                }))
        {
            return None;
        }
        let (core, pre) = core
            .split_once('-')
            .map_or((core, None), |(c, p)| (c, Some(p)));
        let number = |p: &str| -> Option<u64> {
            if p.is_empty()
                || !p.bytes().all(|c| c.is_ascii_digit())
                || (p.len() > 1 && p.starts_with('0'))
            {
                return None;
            }
            p.parse().ok()
        };
        let parts: Vec<&str> = core.split('.').collect();
        let [major, minor, patch] = parts.as_slice() else {
            return None;
        };
        let pre = match pre {
            None => Vec::new(),
            Some(p) => {
                let ids: Vec<String> = p.split('.').map(str::to_string).collect();
                for id in &ids {
                    let valid = !id.is_empty()
                        && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                        && !(id.bytes().all(|c| c.is_ascii_digit())
                            && id.len() > 1
                            && id.starts_with('0'));
                    if !valid {
                        return None;
                    }
                }
                ids
            }
        };
        Some(Semver {
            major: number(major)?,
            minor: number(minor)?,
            patch: number(patch)?,
            pre,
        })
    }
}

impl Semver {
    /// `semver(s, true)`: Kubernetes' normalization before the strict parse
    /// — one leading `v` dropped, leading zeros of the (up to three)
    /// dot-separated parts dropped, a missing minor and patch read as 0 (a
    /// short version may carry no pre-release or build). Only `v1.2.3`,
    /// `1.2`, `01.02.03` and the like are read that the strict parse refuses.
    pub fn parse_normalized(s: &str) -> Option<Semver> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s.splitn(3, '.').map(str::to_string).collect();
        for part in &mut parts {
            if part.len() > 1 {
                let trimmed = part.trim_start_matches('0');
                *part = if trimmed.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
                    trimmed.to_string()
                } else {
                    format!("0{trimmed}")
                };
            }
        }
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return None;
            }
            parts.resize(3, "0".to_string());
        }
        Semver::parse(&parts.join("."))
    }
}

/// The string argument and the normalize flag of `semver` / `isSemver`
/// (`name(s)` or `name(s, normalize)`).
fn version_args<'a>(
    ftx: &FunctionContext,
    args: &'a [Value],
    name: &str,
) -> Result<(&'a str, bool), ExecutionError> {
    match args {
        [Value::String(s)] => Ok((s, false)),
        [Value::String(s), Value::Bool(normalize)] => Ok((s, *normalize)),
        _ => Err(no_overload(ftx, name)),
    }
}

fn parse_version(s: &str, normalize: bool) -> Option<Semver> {
    if normalize {
        Semver::parse_normalized(s)
    } else {
        Semver::parse(s)
    }
}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let order = match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(x), Ok(y)) => x.cmp(&y),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            (Err(_), Err(_)) => a.cmp(b),
                        };
                        if order != Ordering::Equal {
                            return order;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            })
    }
}

impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

enum Operand {
    Quantity(Quantity),
    Semver(Semver),
    Int(i64),
    Other,
}

fn operand(v: &Value) -> Operand {
    match v {
        Value::Opaque(o) => {
            if let Some(q) = o.downcast_ref::<QuantityValue>() {
                Operand::Quantity(q.0.clone())
            } else if let Some(s) = o.downcast_ref::<Semver>() {
                Operand::Semver(s.clone())
            } else {
                Operand::Other
            }
        }
        Value::Int(i) => Operand::Int(*i),
        _ => Operand::Other,
    }
}

pub(super) fn no_overload(ftx: &FunctionContext, what: &str) -> ExecutionError {
    ftx.error(format!("no such overload: {what}"))
}

fn ordering(
    ftx: &FunctionContext,
    this: &Value,
    other: &Value,
    name: &str,
) -> Result<std::cmp::Ordering, ExecutionError> {
    match (operand(this), operand(other)) {
        (Operand::Quantity(a), Operand::Quantity(b)) => Ok(a.cmp(&b)),
        (Operand::Semver(a), Operand::Semver(b)) => Ok(a.cmp(&b)),
        _ => Err(no_overload(ftx, name)),
    }
}

pub(super) fn register(context: &mut Context) {
    use cel::extractors::{Arguments, This};
    let add =
        |context: &mut Context,
         name: &str,
         f: fn(&FunctionContext, This<Value>, Value) -> Result<Value, ExecutionError>| {
            context.add_function(name, f).expect("a free name");
        };
    context
        .add_function("quantity", |ftx: &FunctionContext, s: Arc<String>| {
            Quantity::parse(&s)
                .map(quantity_value)
                .map_err(|e| ftx.error(e.to_string()))
        })
        .expect("a free name");
    context
        .add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok())
        .expect("a free name");
    context
        .add_function(
            "semver",
            |ftx: &FunctionContext, Arguments(args): Arguments| {
                let (s, normalize) = version_args(ftx, &args, "semver")?;
                parse_version(s, normalize)
                    .map(|v| Value::Opaque(Arc::new(v)))
                    .ok_or_else(|| {
                        ftx.error(format!("could not parse {s:?} as a semantic version"))
                    })
            },
        )
        .expect("a free name");
    context
        .add_function(
            "isSemver",
            |ftx: &FunctionContext, Arguments(args): Arguments| {
                let (s, normalize) = version_args(ftx, &args, "isSemver")?;
                Ok::<Value, ExecutionError>(Value::Bool(parse_version(s, normalize).is_some()))
            },
        )
        .expect("a free name");
    add(context, "compareTo", |ftx, This(this), other| {
        Ok(Value::Int(ordering(ftx, &this, &other, "compareTo")? as i64))
    });
    add(context, "isGreaterThan", |ftx, This(this), other| {
        Ok(Value::Bool(
            ordering(ftx, &this, &other, "isGreaterThan")?.is_gt(),
        ))
    });
    add(context, "isLessThan", |ftx, This(this), other| {
        Ok(Value::Bool(
            ordering(ftx, &this, &other, "isLessThan")?.is_lt(),
        ))
    });
    add(context, "add", |ftx, This(this), other| {
        match (operand(&this), operand(&other)) {
            (Operand::Quantity(a), Operand::Quantity(b)) => Ok(quantity_value(a.add(&b))),
            (Operand::Quantity(a), Operand::Int(b)) => {
                Ok(quantity_value(a.add(&Quantity::from_i64(b))))
            }
            _ => Err(no_overload(ftx, "add")),
        }
    });
    add(context, "sub", |ftx, This(this), other| {
        match (operand(&this), operand(&other)) {
            (Operand::Quantity(a), Operand::Quantity(b)) => Ok(quantity_value(a.sub(&b))),
            (Operand::Quantity(a), Operand::Int(b)) => {
                Ok(quantity_value(a.sub(&Quantity::from_i64(b))))
            }
            _ => Err(no_overload(ftx, "sub")),
        }
    });
    let unary =
        |context: &mut Context,
         name: &str,
         f: fn(&FunctionContext, This<Value>) -> Result<Value, ExecutionError>| {
            context.add_function(name, f).expect("a free name");
        };
    unary(context, "isInteger", |ftx, This(this)| {
        match operand(&this) {
            Operand::Quantity(q) => Ok(Value::Bool(q.as_i64().is_some())),
            _ => Err(no_overload(ftx, "isInteger")),
        }
    });
    unary(context, "asInteger", |ftx, This(this)| {
        match operand(&this) {
            Operand::Quantity(q) => q
                .as_i64()
                .map(Value::Int)
                .ok_or_else(|| ftx.error("cannot convert value to integer")),
            _ => Err(no_overload(ftx, "asInteger")),
        }
    });
    unary(
        context,
        "asApproximateFloat",
        |ftx, This(this)| match operand(&this) {
            Operand::Quantity(q) => Ok(Value::Float(q.as_approximate_f64())),
            _ => Err(no_overload(ftx, "asApproximateFloat")),
        },
    );
    unary(context, "major", |ftx, This(this)| match operand(&this) {
        Operand::Semver(v) => Ok(Value::Int(v.major as i64)),
        _ => Err(no_overload(ftx, "major")),
    });
    unary(context, "minor", |ftx, This(this)| match operand(&this) {
        Operand::Semver(v) => Ok(Value::Int(v.minor as i64)),
        _ => Err(no_overload(ftx, "minor")),
    });
    unary(context, "patch", |ftx, This(this)| match operand(&this) {
        Operand::Semver(v) => Ok(Value::Int(v.patch as i64)),
        _ => Err(no_overload(ftx, "patch")),
    });
}
