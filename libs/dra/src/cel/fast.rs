//! The native fast path: the common selector shapes, evaluated on the device directly.

use std::collections::BTreeMap;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::{Attribute, Device};
use crate::quantity::Quantity;

/// A literal a fast selector compares with.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Literal {
    Int(i64),
    Bool(bool),
    String(String),
}

/// The shapes most selectors have — attribute equality, integer comparison,
/// capacity against a quantity, the driver, and `&&` / `||` / `!` of them —
/// evaluated on the device directly, with CEL's semantics: a missing
/// attribute is `no such key`, values of different types are not equal, an
/// ordering across types has no overload, and `&&` / `||` absorb an error
/// when the other side decides (naming the left error when both fail, as
/// Kubernetes does).
#[derive(Clone, Debug)]
pub(super) enum Fast {
    Driver(String),
    AttrEq {
        key: Key,
        value: Literal,
    },
    AttrOrder {
        key: Key,
        op: &'static str,
        value: i64,
    },
    Capacity {
        key: Key,
        greater: bool,
        value: Quantity,
    },
    /// `….matches('pattern')` on a string attribute, the pattern compiled once.
    AttrMatches {
        key: Key,
        pattern: regex::Regex,
    },
    Not(Box<Fast>),
    And(Box<Fast>, Box<Fast>),
    Or(Box<Fast>, Box<Fast>),
}

/// An attribute or capacity a fast selector reads: `domain/name`, or the bare
/// `name` when the domain is the device's driver.
#[derive(Clone, Debug)]
pub(super) struct Key {
    domain: String,
    name: String,
    /// `domain/name`, built once rather than on every evaluation.
    qualified: String,
}

/// `device.attributes['d']` or `device.capacity['d']` with a literal domain:
/// (capacity?, domain).
pub(super) fn device_domain(e: &IdedExpr) -> Option<(bool, &str)> {
    let Expr::Call(index) = &e.expr else {
        return None;
    };
    let [map, key] = index.args.as_slice() else {
        return None;
    };
    if index.func_name != "_[_]" {
        return None;
    }
    let Expr::Select(field) = &map.expr else {
        return None;
    };
    if !matches!(&field.operand.expr, Expr::Ident(v) if v == "device") {
        return None;
    }
    let capacity = match field.field.as_str() {
        "attributes" => false,
        "capacity" => true,
        _ => return None,
    };
    let Expr::Literal(LiteralValue::String(domain)) = &key.expr else {
        return None;
    };
    Some((capacity, domain.inner()))
}

/// `device.attributes['d'].n` or `device.capacity['d'].n`: (capacity?, key).
fn device_ref(e: &IdedExpr) -> Option<(bool, Key)> {
    let Expr::Select(sel) = &e.expr else {
        return None;
    };
    if sel.test {
        return None;
    }
    let (capacity, domain) = device_domain(&sel.operand)?;
    let (domain, name) = (domain.to_string(), sel.field.clone());
    let qualified = format!("{domain}/{name}");
    Some((
        capacity,
        Key {
            domain,
            name,
            qualified,
        },
    ))
}

fn literal(e: &IdedExpr) -> Option<Literal> {
    match &e.expr {
        Expr::Literal(LiteralValue::Int(i)) => Some(Literal::Int(*i.inner())),
        Expr::Literal(LiteralValue::Boolean(b)) => Some(Literal::Bool(*b.inner())),
        Expr::Literal(LiteralValue::String(s)) => Some(Literal::String(s.inner().to_string())),
        _ => None,
    }
}

pub(super) fn fast(e: &IdedExpr) -> Option<Fast> {
    let Expr::Call(c) = &e.expr else {
        return None;
    };
    let args = c.args.as_slice();
    match (c.func_name.as_str(), &c.target, args) {
        ("!_", None, [x]) => Some(Fast::Not(Box::new(fast(x)?))),
        ("_&&_", None, [a, b]) => Some(Fast::And(Box::new(fast(a)?), Box::new(fast(b)?))),
        ("_||_", None, [a, b]) => Some(Fast::Or(Box::new(fast(a)?), Box::new(fast(b)?))),
        ("_==_" | "_!=_", None, [a, b]) => {
            let eq = if let Expr::Select(sel) = &a.expr
                && sel.field == "driver"
                && !sel.test
                && matches!(&sel.operand.expr, Expr::Ident(v) if v == "device")
            {
                match literal(b)? {
                    Literal::String(s) => Fast::Driver(s),
                    _ => return None,
                }
            } else {
                let (false, key) = device_ref(a)? else {
                    return None;
                };
                Fast::AttrEq {
                    key,
                    value: literal(b)?,
                }
            };
            Some(if c.func_name == "_!=_" {
                Fast::Not(Box::new(eq))
            } else {
                eq
            })
        }
        (op @ ("_<_" | "_<=_" | "_>_" | "_>=_"), None, [a, b]) => {
            let (false, key) = device_ref(a)? else {
                return None;
            };
            let Literal::Int(value) = literal(b)? else {
                return None;
            };
            Some(Fast::AttrOrder {
                key,
                op: match op {
                    "_<_" => "<",
                    "_<=_" => "<=",
                    "_>_" => ">",
                    _ => ">=",
                },
                value,
            })
        }
        ("matches", Some(target), [arg]) => {
            let (false, key) = device_ref(target)? else {
                return None;
            };
            let Literal::String(pattern) = literal(arg)? else {
                return None;
            };
            Some(Fast::AttrMatches {
                key,
                // A pattern the regex engine refuses is left to the interpreter.
                pattern: regex::Regex::new(&pattern).ok()?,
            })
        }
        (method @ ("isGreaterThan" | "isLessThan"), Some(target), [arg]) => {
            let (true, key) = device_ref(target)? else {
                return None;
            };
            let Expr::Call(q) = &arg.expr else {
                return None;
            };
            let [text] = q.args.as_slice() else {
                return None;
            };
            if q.func_name != "quantity" || q.target.is_some() {
                return None;
            }
            let Literal::String(text) = literal(text)? else {
                return None;
            };
            Some(Fast::Capacity {
                key,
                greater: method == "isGreaterThan",
                value: Quantity::parse(&text).ok()?,
            })
        }
        _ => None,
    }
}

fn lookup<'a, T>(map: &'a BTreeMap<String, T>, driver: &str, key: &Key) -> Result<&'a T, String> {
    map.get(&key.qualified)
        .or_else(|| (key.domain == driver).then(|| map.get(&key.name)).flatten())
        .ok_or_else(|| format!("no such key: {}", key.name))
}

impl Fast {
    /// The names [`Fast::eval`] may look up (see [`lookup`]).
    pub(super) fn reads(&self, names: &mut std::collections::BTreeSet<String>) {
        match self {
            Fast::Driver(_) => {}
            Fast::AttrEq { key, .. }
            | Fast::AttrOrder { key, .. }
            | Fast::Capacity { key, .. }
            | Fast::AttrMatches { key, .. } => {
                names.insert(key.qualified.clone());
                names.insert(key.name.clone());
            }
            Fast::Not(x) => x.reads(names),
            Fast::And(a, b) | Fast::Or(a, b) => {
                a.reads(names);
                b.reads(names);
            }
        }
    }

    pub(super) fn eval(&self, d: &Device) -> Result<bool, String> {
        match self {
            Fast::Driver(s) => Ok(d.driver == *s),
            Fast::AttrEq { key, value } => {
                Ok(match (lookup(&d.attributes, &d.driver, key)?, value) {
                    (Attribute::Int(a), Literal::Int(b)) => a == b,
                    (Attribute::Bool(a), Literal::Bool(b)) => a == b,
                    (Attribute::String(a), Literal::String(b)) => a == b,
                    _ => false,
                })
            }
            Fast::AttrOrder { key, op, value } => match lookup(&d.attributes, &d.driver, key)? {
                Attribute::Int(a) => Ok(match *op {
                    "<" => a < value,
                    "<=" => a <= value,
                    ">" => a > value,
                    _ => a >= value,
                }),
                _ => Err(format!("no such overload: {op}")),
            },
            Fast::Capacity {
                key,
                greater,
                value,
            } => {
                let have = lookup(&d.capacity, &d.driver, key)?;
                Ok(if *greater { have > value } else { have < value })
            }
            Fast::AttrMatches { key, pattern } => match lookup(&d.attributes, &d.driver, key)? {
                Attribute::String(s) => Ok(pattern.is_match(s)),
                _ => Err("no such overload: matches".to_string()),
            },
            Fast::Not(x) => x.eval(d).map(|b| !b),
            Fast::And(a, b) => match (a.eval(d), b.eval(d)) {
                (Ok(false), _) | (_, Ok(false)) => Ok(false),
                (Ok(true), Ok(true)) => Ok(true),
                (Err(e), _) | (_, Err(e)) => Err(e),
            },
            Fast::Or(a, b) => match (a.eval(d), b.eval(d)) {
                (Ok(true), _) | (_, Ok(true)) => Ok(true),
                (Ok(false), Ok(false)) => Ok(false),
                (Err(e), _) | (_, Err(e)) => Err(e),
            },
        }
    }
}
