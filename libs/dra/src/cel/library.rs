//! Kubernetes' lists, sets and regex libraries, list `first` / `last`, DRA's
//! `includes`, `cel.bind`.

use std::sync::Arc;

use cel::common::ast::{ComprehensionExpr, Expr, ListExpr, LiteralValue};
use cel::common::value::CowVal;
use cel::parser::Macro;
use cel::{Context, Env, ExecutionError, FunctionContext, Value};

use super::values::no_overload;

/// The list functions the crate does not have: Kubernetes' `indexOf` and
/// `lastIndexOf` on lists (the first / last index of an equal element, or
/// -1), the optional library's `first` and `last` (the element, or
/// `optional.none()` for an empty list), and DRA's `includes` (see
/// [`includes`]). The string overloads of `indexOf` and `lastIndexOf` stay
/// the string extension's.
pub(super) fn list_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    use cel::common::types::{DYN_TYPE, LIST_TYPE};
    env.add_member_overload(
        "includes",
        "dra_includes_dyn_dyn",
        DYN_TYPE,
        vec![DYN_TYPE],
        includes,
    )?;
    env.add_member_overload(
        "indexOf",
        "list_indexOf",
        LIST_TYPE,
        vec![DYN_TYPE],
        |args| list_position(args, false),
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_lastIndexOf",
        LIST_TYPE,
        vec![DYN_TYPE],
        |args| list_position(args, true),
    )?;
    env.add_member_overload("first", "list_first", LIST_TYPE, vec![], |args| {
        list_end(args, false)
    })?;
    env.add_member_overload("last", "list_last", LIST_TYPE, vec![], |args| {
        list_end(args, true)
    })?;
    Ok(())
}

fn list_items<'b, 'v>(
    list: &'b CowVal<'_, 'v>,
) -> Result<Vec<&'b (dyn cel::common::value::Val + 'v)>, ExecutionError> {
    let iterable = list
        .as_iterable()
        .ok_or_else(|| ExecutionError::function_error("list", "not a list"))?;
    let mut items = iterable.iter();
    let mut out = Vec::new();
    while let Some(item) = items.next() {
        out.push(item);
    }
    Ok(out)
}

fn list_position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, wanted]: [CowVal<'b, 'v>; 2] = args
        .try_into()
        .map_err(|a: Vec<_>| ExecutionError::invalid_argument_count(2, a.len()))?;
    let items = list_items(&list)?;
    let equal = |item: &&(dyn cel::common::value::Val + 'v)| item.equals(wanted.as_ref());
    let found = if last {
        items.iter().rposition(equal)
    } else {
        items.iter().position(equal)
    };
    let index = found.map_or(-1, |i| i as i64);
    Ok(CowVal::owned(cel::common::types::CelInt::from(index)))
}

/// Kubernetes' limit on the values of a list attribute
/// (`ResourceSliceMaxAttributeValuesPerDevice`), which bounds `includes`.
pub(super) const MAX_ATTRIBUTE_VALUES: usize = 48;

/// `target.includes(x)`, the function Kubernetes 1.36 adds for list-typed
/// attributes: whether a list has an element equal to `x` (an error past
/// [`MAX_ATTRIBUTE_VALUES`] elements without one), or whether any other
/// value equals `x`. With DRAListTypeAttributes off, as in 1.36 by default,
/// the API server refuses it in new selectors, but the scheduler compiles
/// stored selectors in the environment that declares every function of the
/// release, so a stored selector that calls it is evaluated — found by
/// Kubernetes' own CEL table (libs/dra/tests/conformance.rs).
fn includes<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [target, wanted]: [CowVal<'b, 'v>; 2] = args
        .try_into()
        .map_err(|a: Vec<_>| ExecutionError::invalid_argument_count(2, a.len()))?;
    let found = if target.get_type().kind() == cel::common::types::Kind::List {
        let mut found = false;
        for (i, item) in list_items(&target)?.into_iter().enumerate() {
            if i >= MAX_ATTRIBUTE_VALUES {
                return Err(ExecutionError::function_error(
                    "includes",
                    format!(
                        "'includes' function cannot be applied to lists longer than {MAX_ATTRIBUTE_VALUES} values"
                    ),
                ));
            }
            if item.equals(wanted.as_ref()) {
                found = true;
                break;
            }
        }
        found
    } else {
        target.equals(wanted.as_ref())
    };
    Ok(CowVal::owned(cel::common::types::CelBool::from(found)))
}

fn list_end<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list]: [CowVal<'b, 'v>; 1] = args
        .try_into()
        .map_err(|a: Vec<_>| ExecutionError::invalid_argument_count(1, a.len()))?;
    let items = list_items(&list)?;
    let end = if last { items.last() } else { items.first() };
    Ok(CowVal::owned(match end {
        Some(item) => cel::common::types::CelOptional::of(item.clone_as_boxed()),
        None => cel::common::types::CelOptional::none(),
    }))
}

/// `cel.bind(name, init, body)`: `body` with `name` bound to `init`, as
/// cel-go's bindings extension expands it — a comprehension over an empty list
/// whose accumulator is the binding.
pub(super) fn bind_macro() -> Macro {
    Macro::receiver("bind", 3, |helper, target, args| {
        if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel") {
            return Ok(None);
        }
        let body = args.pop().expect("three arguments");
        let init = args.pop().expect("three arguments");
        let name = args.pop().expect("three arguments");
        let Expr::Ident(var) = name.expr else {
            return Err(helper.new_error(
                name.id,
                "cel.bind() variable names must be simple identifiers",
            ));
        };
        let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
        let never = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
        let step = helper.next_expr(Expr::Ident(var.clone()));
        Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(
            ComprehensionExpr {
                iter_range: empty,
                iter_var: "#unused".into(),
                iter_var2: None,
                accu_var: var,
                accu_init: init,
                loop_cond: never,
                loop_step: step,
                result: body,
            },
        )))))
    })
}

/// Kubernetes' lists library (`isSorted`, `sum`, `min`, `max`), the sets
/// extension (`sets.contains`, `sets.equivalent`, `sets.intersects`) and the
/// regex library (`find`, `findAll`), with Kubernetes' semantics and wording.
pub(super) fn register_lists_sets_regex(context: &mut Context) {
    use cel::extractors::{Arguments, This};
    let list = |ftx: &FunctionContext, v: &Value, name: &str| match v {
        Value::List(items) => Ok(items.clone()),
        _ => Err(no_overload(ftx, name)),
    };
    context
        .add_function(
            "isSorted",
            move |ftx: &FunctionContext, This(this): This<Value>| {
                let items = list(ftx, &this, "isSorted")?;
                for pair in items.windows(2) {
                    match pair[0].partial_cmp(&pair[1]) {
                        Some(std::cmp::Ordering::Greater) => return Ok(Value::Bool(false)),
                        Some(_) => {}
                        None => return Err(no_overload(ftx, "isSorted")),
                    }
                }
                Ok(Value::Bool(true))
            },
        )
        .expect("a free name");
    context
        .add_function(
            "sum",
            move |ftx: &FunctionContext, This(this): This<Value>| {
                let items = list(ftx, &this, "sum")?;
                let mut total: Option<Value> = None;
                for item in items.iter() {
                    total = Some(match (total, item) {
                        (None, v @ (Value::Int(_) | Value::UInt(_) | Value::Float(_))) => v.clone(),
                        (Some(Value::Int(a)), Value::Int(b)) => Value::Int(
                            a.checked_add(*b)
                                .ok_or_else(|| ftx.error("integer overflow"))?,
                        ),
                        (Some(Value::UInt(a)), Value::UInt(b)) => Value::UInt(
                            a.checked_add(*b)
                                .ok_or_else(|| ftx.error("unsigned integer overflow"))?,
                        ),
                        (Some(Value::Float(a)), Value::Float(b)) => Value::Float(a + b),
                        _ => return Err(no_overload(ftx, "sum")),
                    });
                }
                // The zero of an empty list: an int (a typed empty list would
                // give its type's zero, and compares equal to it).
                Ok(total.unwrap_or(Value::Int(0)))
            },
        )
        .expect("a free name");
    for (name, prefer) in [
        ("min", std::cmp::Ordering::Greater),
        ("max", std::cmp::Ordering::Less),
    ] {
        let f = move |ftx: &FunctionContext, This(this): This<Value>| {
            let items = list(ftx, &this, name)?;
            let mut best: Option<&Value> = None;
            for item in items.iter() {
                best = match best {
                    None => Some(item),
                    Some(b) => match b.partial_cmp(item) {
                        Some(o) if o == prefer => Some(item),
                        Some(_) => Some(b),
                        None => return Err(no_overload(ftx, name)),
                    },
                };
            }
            best.cloned()
                .ok_or_else(|| ftx.error(format!("{name} called on empty list")))
        };
        context.add_function(name, f).expect("a free name");
    }
    let pair = |ftx: &FunctionContext, args: &[Value], name: &str| match args {
        [Value::List(a), Value::List(b)] => Ok((a.clone(), b.clone())),
        _ => Err(no_overload(ftx, name)),
    };
    let contains = |all: &[Value], some: &[Value]| some.iter().all(|x| all.iter().any(|y| x == y));
    context
        .add_function(
            "sets.contains",
            move |ftx: &FunctionContext, Arguments(args): Arguments| {
                let (a, b) = pair(ftx, &args, "sets.contains")?;
                Ok(Value::Bool(contains(&a, &b)))
            },
        )
        .expect("a free name");
    context
        .add_function(
            "sets.equivalent",
            move |ftx: &FunctionContext, Arguments(args): Arguments| {
                let (a, b) = pair(ftx, &args, "sets.equivalent")?;
                Ok(Value::Bool(contains(&a, &b) && contains(&b, &a)))
            },
        )
        .expect("a free name");
    context
        .add_function(
            "sets.intersects",
            move |ftx: &FunctionContext, Arguments(args): Arguments| {
                let (a, b) = pair(ftx, &args, "sets.intersects")?;
                Ok(Value::Bool(a.iter().any(|x| b.iter().any(|y| x == y))))
            },
        )
        .expect("a free name");
    let regex = |ftx: &FunctionContext, pattern: &str| {
        regex::Regex::new(pattern).map_err(|e| ftx.error(format!("Illegal regex: {e}")))
    };
    context
        .add_function(
            "find",
            move |ftx: &FunctionContext, This(this): This<Arc<String>>, pattern: Arc<String>| {
                let re = regex(ftx, &pattern)?;
                Ok::<Value, ExecutionError>(Value::from(
                    re.find(&this)
                        .map(|m| m.as_str().to_string())
                        .unwrap_or_default(),
                ))
            },
        )
        .expect("a free name");
    context
        .add_function(
            "findAll",
            move |ftx: &FunctionContext,
                  This(this): This<Arc<String>>,
                  Arguments(args): Arguments| {
                let (pattern, limit) = match args.as_slice() {
                    [Value::String(p)] => (p.clone(), -1),
                    [Value::String(p), Value::Int(n)] => (p.clone(), *n),
                    _ => return Err(no_overload(ftx, "findAll")),
                };
                let re = regex(ftx, &pattern)?;
                let found = re
                    .find_iter(&this)
                    .map(|m| Value::from(m.as_str().to_string()));
                let found: Vec<Value> = if limit < 0 {
                    found.collect()
                } else {
                    found.take(limit as usize).collect()
                };
                Ok(Value::List(Arc::new(found)))
            },
        )
        .expect("a free name");
}
