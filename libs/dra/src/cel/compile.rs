//! Compiling a selector: the functions it may use, Kubernetes' refusals, the cache.

use std::collections::BTreeSet;
use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::fast::{device_domain, fast};
use super::{CompileError, Compiler, MAX_EXPRESSION_LENGTH, Selector};

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
    // DRA's `includes` (declared for stored selectors; see library.rs)
    "includes",
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
        let max_cost = super::cost::max_cost(program.expression()).map_err(CompileError::Syntax)?;
        if let Some(cost) = max_cost
            && cost > super::cost::MAX_COST
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
}
