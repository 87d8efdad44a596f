//! DRA device selectors: CEL as Kubernetes evaluates them (the `device`
//! variable of `k8s.io/dynamic-resource-allocation/cel`), on the `cel` crate.
//!
//! - `device.driver`, `device.allowMultipleAllocations`,
//!   `device.attributes[domain][name]` (int, bool, string, version) and
//!   `device.capacity[domain][name]` (quantity). A name without a domain lives
//!   under the driver's domain. A domain the device does not have is an empty
//!   map; a missing attribute is the error `no such key: <name>`.
//! - The quantity library (`quantity`, `isQuantity`, `compareTo`,
//!   `isGreaterThan`, `isLessThan`, `add`, `sub`, `isInteger`, `asInteger`,
//!   `asApproximateFloat`; `==` compares values — `sign` is not offered to
//!   selectors by Kubernetes 1.36, so it is refused here too) and the semver
//!   library (`semver`, `isSemver`, `major`, `minor`, `patch`, `compareTo`,
//!   `isGreaterThan`, `isLessThan`), plus the crate's standard library, string
//!   extensions and macros.
//! - Compile-time refusals: more than 10 Ki characters, a function Kubernetes
//!   does not offer (or this build does not implement yet — said so), a result
//!   that is visibly not a bool, a worst-case cost over 1,000,000 as the API
//!   server estimates it (`cel_cost`). Compiled selectors are cached by
//!   their text.
//!
//! `cel.bind` is the bindings macro; optional types (`a.?b`, `m[?k]`,
//! `optional.of/none/ofNonZeroValue`, `hasValue`, `value`, `orValue`, `or`)
//! are the crate's; list `indexOf` / `lastIndexOf` (Kubernetes' lists
//! library), `first` / `last` (the optional library), `dyn` and
//! `strings.quote` too. The type checker's refusals that follow from the
//! types known here: a list or map literal mixing element types
//! (`expected type 'int' but found 'string'`) and `indexOf` of a value of
//! another type than the list's. Not yet, and refused as such: the URL, IP,
//! CIDR, format, duration, timestamp and bytes libraries and two-variable
//! comprehensions. One known difference: when both sides of `&&` or `||`
//! fail, Kubernetes reports the left side's error and this evaluator the right
//! side's (the result — an error — is the same).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::value::CowVal;
use cel::objects::Opaque;
use cel::parser::Macro;
use cel::{Context, Env, ExecutionError, FunctionContext, Program, Value, extensions};

use crate::quantity::Quantity;

/// Kubernetes' limit on a selector's length (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;

/// One attribute value of a device.
#[derive(Clone, Debug, PartialEq)]
pub enum Attribute {
    Int(i64),
    Bool(bool),
    String(String),
    /// A semantic version, as published (`1.2.3`).
    Version(String),
}

/// A device as selectors see it: names are `domain/name` or bare (the driver's domain).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Device {
    pub driver: String,
    pub allow_multiple_allocations: bool,
    pub attributes: BTreeMap<String, Attribute>,
    pub capacity: BTreeMap<String, Quantity>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error(
        "the expression is {length} characters long; at most {MAX_EXPRESSION_LENGTH} are allowed"
    )]
    TooLong { length: usize },
    #[error("compilation failed: {0}")]
    Syntax(String),
    #[error("undeclared reference to '{0}'")]
    Undeclared(String),
    #[error("'{0}' is offered by Kubernetes but not supported by Switchyard yet")]
    Unsupported(String),
    #[error("must evaluate to bool or the unknown type, not {0}")]
    NotBool(&'static str),
    #[error(
        "too complex, exceeds cost limit: the worst-case cost is estimated at {cost}; at most {} is allowed",
        crate::cel_cost::MAX_COST
    )]
    TooComplex { cost: u64 },
}

/// A runtime error, worded as Kubernetes words it where it matters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

/// Functions (and operators) a selector may use here.
const SUPPORTED: &[&str] = &[
    // operators
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_&&_",
    "_||_",
    "!_",
    "-_",
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "_?_:_",
    "_[_]",
    "@in",
    "@not_strictly_false",
    // standard library
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    // string extensions
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    // (`strings.quote(s)` is the call `quote` on the namespace `strings`)
    "quote",
    "dyn",
    // optional types (`a.?b`, `m[?k]`, `optional.*`)
    "_?._",
    "_[?_]",
    // (`optional.of(x)` is the call `of` on the namespace `optional`)
    "of",
    "none",
    "ofNonZeroValue",
    "orValue",
    "hasValue",
    "value",
    "or",
    // the list extensions (cel-go's ext.Lists, version 3)
    "slice",
    "flatten",
    "distinct",
    "reverse",
    "sort",
    "@sortByAssociatedKeys",
    // the optional library's list functions
    "first",
    "last",
    // (`lists.range(n)` is the call `range` on the namespace `lists`)
    "range",
    // Kubernetes' lists library, the sets extension, the regex library
    "isSorted",
    "sum",
    "min",
    "max",
    // (`sets.contains(a, b)` is the call `contains` on the namespace `sets`)
    "equivalent",
    "intersects",
    "find",
    "findAll",
    // quantity and semver libraries
    "quantity",
    "isQuantity",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "add",
    "sub",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "semver",
    "isSemver",
    "major",
    "minor",
    "patch",
];

/// Functions Kubernetes offers to selectors that this build does not implement yet.
const NOT_YET: &[&str] = &[
    "format",
    "url",
    "isURL",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "duration",
    "timestamp",
    "bytes",
];

/// A compiled selector.
#[derive(Debug)]
pub struct Selector {
    program: Program,
    /// Domains the selector indexes `device.attributes` / `device.capacity` with.
    domains: BTreeSet<String>,
    /// The common shapes, evaluated natively (see [`Fast`]).
    fast: Option<Fast>,
    /// The worst-case cost, as the API server estimates it (`None` where
    /// the selector uses a library not estimated here).
    max_cost: Option<u64>,
}

impl Selector {
    /// The worst-case cost the API server compares with 1,000,000.
    pub fn max_cost(&self) -> Option<u64> {
        self.max_cost
    }

    /// Whether the selector is evaluated by the native fast path.
    pub fn is_fast(&self) -> bool {
        self.fast.is_some()
    }
}

/// A literal a fast selector compares with.
#[derive(Clone, Debug, PartialEq)]
enum Literal {
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
enum Fast {
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
struct Key {
    domain: String,
    name: String,
    /// `domain/name`, built once rather than on every evaluation.
    qualified: String,
}

/// `device.attributes['d']` or `device.capacity['d']` with a literal domain:
/// (capacity?, domain).
fn device_domain(e: &IdedExpr) -> Option<(bool, &str)> {
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

fn fast(e: &IdedExpr) -> Option<Fast> {
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
    fn eval(&self, d: &Device) -> Result<bool, String> {
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

/// Compiles selectors once and evaluates them against devices.
pub struct Compiler {
    env: Arc<Env>,
    /// The functions of the libraries, registered once; each evaluation runs
    /// in a child scope that only adds `device`.
    root: Context<'static, 'static>,
    cache: Mutex<HashMap<String, Arc<Result<Selector, CompileError>>>>,
}

impl Default for Compiler {
    fn default() -> Self {
        let mut env = Env::stdlib();
        env.add_extension(extensions::strings)
            .expect("the string extensions load");
        env.add_extension(extensions::lists)
            .expect("the list extensions load");
        env.add_extension(list_library)
            .expect("the list functions are free");
        env.add_macro(bind_macro()).expect("cel.bind is not taken");
        let env = Arc::new(env);
        let mut root = Context::with_env(env.clone());
        register(&mut root);
        Compiler {
            env,
            root,
            cache: Mutex::default(),
        }
    }
}

/// The list functions the crate does not have: Kubernetes' `indexOf` and
/// `lastIndexOf` on lists (the first / last index of an equal element, or
/// -1), and the optional library's `first` and `last` (the element, or
/// `optional.none()` for an empty list). The string overloads of `indexOf`
/// and `lastIndexOf` stay the string extension's.
fn list_library(env: &mut Env) -> Result<(), cel::DeclarationError> {
    use cel::common::types::{DYN_TYPE, LIST_TYPE};
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
fn bind_macro() -> Macro {
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

fn walk<'a>(e: &'a IdedExpr, visit: &mut impl FnMut(&'a IdedExpr)) {
    visit(e);
    match &e.expr {
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                walk(t, visit);
            }
            for a in &c.args {
                walk(a, visit);
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                walk(x, visit);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(|x| walk(x, visit)),
        Expr::Select(s) => walk(&s.operand, visit),
        _ => {}
    }
}

/// A top-level expression whose type is known not to be bool.
fn visibly_not_bool(e: &IdedExpr) -> Option<&'static str> {
    match &e.expr {
        Expr::Literal(LiteralValue::Int(_)) => Some("int"),
        Expr::Literal(LiteralValue::UInt(_)) => Some("uint"),
        Expr::Literal(LiteralValue::Double(_)) => Some("double"),
        Expr::Literal(LiteralValue::String(_)) => Some("string"),
        Expr::Literal(LiteralValue::Bytes(_)) => Some("bytes"),
        Expr::Literal(LiteralValue::Null) => Some("null_type"),
        Expr::List(_) => Some("list(dyn)"),
        Expr::Map(_) => Some("map(dyn, dyn)"),
        Expr::Call(c) => match c.func_name.as_str() {
            "size" | "int" | "compareTo" | "asInteger" | "major" | "minor" | "patch" => Some("int"),
            "string" | "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring" => {
                Some("string")
            }
            "quantity" | "add" | "sub" => Some("kubernetes.Quantity"),
            "semver" => Some("kubernetes.Semver"),
            "double" | "asApproximateFloat" => Some("double"),
            _ => None,
        },
        _ => None,
    }
}

impl Compiler {
    /// The selector for `expression`, compiled on first use.
    pub fn compile(&self, expression: &str) -> Arc<Result<Selector, CompileError>> {
        if let Some(hit) = self.cache.lock().expect("cache").get(expression) {
            return hit.clone();
        }
        let compiled = Arc::new(self.compile_uncached(expression));
        self.cache
            .lock()
            .expect("cache")
            .insert(expression.to_string(), compiled.clone());
        compiled
    }

    fn compile_uncached(&self, expression: &str) -> Result<Selector, CompileError> {
        if expression.chars().count() > MAX_EXPRESSION_LENGTH {
            return Err(CompileError::TooLong {
                length: expression.chars().count(),
            });
        }
        let program = self
            .env
            .compile(expression)
            .map_err(|e| CompileError::Syntax(e.to_string()))?;
        // Two-variable comprehensions (`list.all(i, v, p)`, `transformMap`, ...)
        // are not macros of this build: their calls would otherwise be
        // reported as undeclared variables.
        let mut two_variables = None;
        walk(program.expression(), &mut |e| {
            let Expr::Call(c) = &e.expr else { return };
            let macro_with = |n: usize| c.target.is_some() && c.args.len() == n;
            let two = match c.func_name.as_str() {
                "all" | "exists" | "existsOne" | "exists_one" => macro_with(3),
                "transformList" | "transformMap" | "transformMapEntry" => {
                    macro_with(3) || macro_with(4)
                }
                _ => false,
            };
            if two && two_variables.is_none() {
                two_variables = Some(format!("{} with two variables", c.func_name));
            }
        });
        if let Some(what) = two_variables {
            return Err(CompileError::Unsupported(what));
        }
        let references = program.references();
        // Names bound by macros (comprehension variables, cel.bind) are not free.
        let mut bound = BTreeSet::new();
        walk(program.expression(), &mut |e| {
            if let Expr::Comprehension(c) = &e.expr {
                bound.insert(c.iter_var.as_str());
                bound.insert(c.accu_var.as_str());
                if let Some(v) = &c.iter_var2 {
                    bound.insert(v.as_str());
                }
            }
        });
        for variable in references.variables() {
            // `optional` is the namespace of `optional.of()` and friends.
            if variable != "device"
                && variable != "optional"
                && variable != "sets"
                && variable != "strings"
                && variable != "lists"
                && !bound.contains(variable)
            {
                return Err(CompileError::Undeclared(variable.to_string()));
            }
        }
        let mut functions = references.functions();
        functions.sort_unstable();
        // A library not implemented yet is named before its member functions
        // (`ip(s).family()`) could be reported undeclared.
        if let Some(f) = functions.iter().find(|f| NOT_YET.contains(f)) {
            return Err(CompileError::Unsupported(f.to_string()));
        }
        for f in functions {
            if !SUPPORTED.contains(&f) {
                return Err(CompileError::Undeclared(f.to_string()));
            }
        }
        // A regex literal must compile, as Kubernetes validates them when
        // compiling (`ValidateRegexLiterals`).
        let mut bad_regex = None;
        walk(program.expression(), &mut |e| {
            let Expr::Call(call) = &e.expr else { return };
            if !matches!(call.func_name.as_str(), "matches" | "find" | "findAll") {
                return;
            }
            let pattern = if call.target.is_some() {
                call.args.first()
            } else {
                call.args.get(1)
            };
            if let Some(Expr::Literal(LiteralValue::String(p))) = pattern.map(|p| &p.expr)
                && let Err(err) = regex::Regex::new(p.inner())
                && bad_regex.is_none()
            {
                bad_regex = Some(format!("invalid regex {:?}: {err}", p.inner()));
            }
        });
        if let Some(message) = bad_regex {
            return Err(CompileError::Syntax(message));
        }
        if let Some(t) = visibly_not_bool(program.expression()) {
            return Err(CompileError::NotBool(t));
        }
        let mut domains = BTreeSet::new();
        walk(program.expression(), &mut |e| {
            if let Some((_, domain)) = device_domain(e) {
                domains.insert(domain.to_string());
            }
        });
        let max_cost =
            crate::cel_cost::max_cost(program.expression()).map_err(CompileError::Syntax)?;
        if let Some(cost) = max_cost
            && cost > crate::cel_cost::MAX_COST
        {
            return Err(CompileError::TooComplex { cost });
        }
        let fast = fast(program.expression());
        Ok(Selector {
            program,
            domains,
            fast,
            max_cost,
        })
    }

    /// Evaluates `selector` against `device`.
    pub fn matches(&self, selector: &Selector, device: &Device) -> Result<bool, EvalError> {
        if let Some(fast) = &selector.fast {
            return fast.eval(device).map_err(EvalError);
        }
        self.matches_prepared(selector, &self.prepare(device)?)
    }

    /// [`Self::matches`] through the interpreter only (for tests comparing the two).
    pub fn matches_interpreted(
        &self,
        selector: &Selector,
        device: &Device,
    ) -> Result<bool, EvalError> {
        self.interpret(selector, &self.prepare(device)?)
    }

    /// A device's CEL value, built once for many selectors.
    pub fn prepare(&self, device: &Device) -> Result<PreparedDevice, EvalError> {
        // Every domain the device has is in both maps (empty where it has
        // nothing), so a selector naming only those needs no other value.
        let domains: BTreeSet<String> = device
            .attributes
            .keys()
            .chain(device.capacity.keys())
            .map(|name| split_name(name, &device.driver).0.to_string())
            .collect();
        Ok(PreparedDevice {
            value: device_value(device, &domains)?,
            domains,
            device: device.clone(),
        })
    }

    /// Evaluates `selector` against a prepared device.
    pub fn matches_prepared(
        &self,
        selector: &Selector,
        device: &PreparedDevice,
    ) -> Result<bool, EvalError> {
        if let Some(fast) = &selector.fast {
            return fast.eval(&device.device).map_err(EvalError);
        }
        self.interpret(selector, device)
    }

    fn interpret(&self, selector: &Selector, device: &PreparedDevice) -> Result<bool, EvalError> {
        let mut context = self.root.new_inner_scope();
        // A domain the selector names that the device lacks must read as an
        // empty map: only then is the value built again with it.
        if selector.domains.is_subset(&device.domains) {
            context.add_variable_from_value("device", device.value.clone());
        } else {
            context.add_variable_from_value(
                "device",
                device_value(&device.device, &selector.domains)?,
            );
        }
        match selector.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(EvalError(format!(
                "CEL result of type {} could not be converted to bool",
                type_name(&other)
            ))),
            Err(err) => Err(EvalError(kubernetes_wording(&err))),
        }
    }

    /// Compiles (cached) and evaluates in one step.
    pub fn eval(&self, expression: &str, device: &Device) -> Result<bool, SelectorError> {
        let compiled = self.compile(expression);
        match compiled.as_ref() {
            Err(e) => Err(SelectorError::Compile(e.clone())),
            Ok(selector) => self.matches(selector, device).map_err(SelectorError::Eval),
        }
    }
}

/// A device with its CEL value built (see [`Compiler::prepare`]).
#[derive(Clone, Debug)]
pub struct PreparedDevice {
    value: Value,
    /// Domains the device has attributes or capacities in.
    domains: BTreeSet<String>,
    device: Device,
}

/// Either kind of failure of a selector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(transparent)]
    Compile(CompileError),
    #[error(transparent)]
    Eval(EvalError),
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Null => "null_type",
        Value::Opaque(o) if o.downcast_ref::<QuantityValue>().is_some() => "kubernetes.Quantity",
        Value::Opaque(o) if o.downcast_ref::<Semver>().is_some() => "kubernetes.Semver",
        _ => "dyn",
    }
}

fn kubernetes_wording(err: &ExecutionError) -> String {
    match err {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn split_name<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

fn device_value(device: &Device, domains: &BTreeSet<String>) -> Result<Value, EvalError> {
    let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
    let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
    for domain in domains {
        attributes.entry(domain.clone()).or_default();
        capacity.entry(domain.clone()).or_default();
    }
    for (name, attribute) in &device.attributes {
        let (domain, id) = split_name(name, &device.driver);
        let value = match attribute {
            Attribute::Int(v) => Value::Int(*v),
            Attribute::Bool(v) => Value::Bool(*v),
            Attribute::String(v) => Value::from(v.as_str()),
            Attribute::Version(v) => {
                Value::Opaque(Arc::new(Semver::parse(v).ok_or_else(|| {
                    EvalError(format!(
                        "attribute {name}: parse semantic version: {v:?} is not a semantic version"
                    ))
                })?))
            }
        };
        attributes
            .entry(domain.to_string())
            .or_default()
            .insert(id.to_string(), value);
    }
    for (name, q) in &device.capacity {
        let (domain, id) = split_name(name, &device.driver);
        capacity
            .entry(domain.to_string())
            .or_default()
            .insert(id.to_string(), quantity_value(q.clone()));
    }
    let nested = |m: HashMap<String, HashMap<String, Value>>| {
        Value::from(
            m.into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect::<HashMap<String, Value>>(),
        )
    };
    let mut root: HashMap<String, Value> = HashMap::new();
    root.insert("driver".into(), Value::from(device.driver.as_str()));
    root.insert(
        "allowMultipleAllocations".into(),
        Value::Bool(device.allow_multiple_allocations),
    );
    root.insert("attributes".into(), nested(attributes));
    root.insert("capacity".into(), nested(capacity));
    Ok(Value::from(root))
}

// ---------------------------------------------------------------- quantity and semver values

#[derive(Clone, Debug, PartialEq, Eq)]
struct QuantityValue(Quantity);

impl Opaque for QuantityValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

fn quantity_value(q: Quantity) -> Value {
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

fn no_overload(ftx: &FunctionContext, what: &str) -> ExecutionError {
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

fn register(context: &mut Context) {
    use cel::extractors::This;
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
        .add_function("semver", |ftx: &FunctionContext, s: Arc<String>| {
            Semver::parse(&s)
                .map(|v| Value::Opaque(Arc::new(v)))
                .ok_or_else(|| ftx.error(format!("could not parse {s:?} as a semantic version")))
        })
        .expect("a free name");
    context
        .add_function("isSemver", |s: Arc<String>| Semver::parse(&s).is_some())
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
    register_lists_sets_regex(context);
}

/// Kubernetes' lists library (`isSorted`, `sum`, `min`, `max`), the sets
/// extension (`sets.contains`, `sets.equivalent`, `sets.intersects`) and the
/// regex library (`find`, `findAll`), with Kubernetes' semantics and wording.
fn register_lists_sets_regex(context: &mut Context) {
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
