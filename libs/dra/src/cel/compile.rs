//! Compiling a selector: the functions it may use, Kubernetes' refusals, the cache.

use std::collections::BTreeSet;
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, MapExpr, StructExpr};
use cel::{Env, Program};

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

/// The deepest expression tree compiled. Kubernetes' parser refuses a
/// selector nested more than 250 levels deep ("max recursion depth
/// exceeded"); the longest chains it accepts — 250 `+` or `==` terms, 249
/// field selections, calls or indexes — are trees 251 or 252 nodes deep, so
/// this build compiles at most a chain one link longer than Kubernetes does.
/// The parser here builds chains without limit, and the passes after it,
/// the fast path and the interpreter recurse over the tree: a 10 Ki-character
/// chain overflowed a tokio worker's 2 MiB stack (found by the `cel` fuzz
/// target).
const MAX_DEPTH: usize = 252;

/// The parser recurses once per link of a chain (`a.b.c`, `f().g()`) and
/// takes chains of any length: a 10 Ki-character one needs several MiB of
/// stack, and the passes after it recurse over the tree, too. Compiling
/// runs on a thread of its own with this much (address space, touched only
/// as far as used), wherever the compiler is called from.
const COMPILE_STACK: usize = 64 << 20;

/// `expression` parsed, or refused as Kubernetes refuses it: too deep for
/// the passes that follow (see [`MAX_DEPTH`]).
fn parse(env: &Env, expression: &str) -> Result<Program, CompileError> {
    let program = env
        .compile(expression)
        .map_err(|e| CompileError::Syntax(e.to_string()))?;
    if depth(program.expression()) > MAX_DEPTH {
        return Err(CompileError::Syntax(
            "ERROR: <input>:-1:0: max recursion depth exceeded".into(),
        ));
    }
    Ok(program)
}

/// How many nodes the longest path from `root` down has; counted without
/// recursion, so any tree the parser builds is measured safely.
fn depth(root: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(root, 1)];
    while let Some((e, d)) = stack.pop() {
        deepest = deepest.max(d);
        let children: Vec<&IdedExpr> = match &e.expr {
            Expr::Call(c) => c.target.as_deref().into_iter().chain(&c.args).collect(),
            Expr::Comprehension(c) => vec![
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ],
            Expr::List(l) => l.elements.iter().collect(),
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => entries
                .iter()
                .flat_map(|entry| match &entry.expr {
                    EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                    EntryExpr::StructField(f) => vec![&f.value],
                })
                .collect(),
            Expr::Select(s) => vec![&*s.operand],
            _ => Vec::new(),
        };
        stack.extend(children.into_iter().map(|child| (child, d + 1)));
    }
    deepest
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
        let compiled = Arc::new(self.compile_on_own_stack(expression));
        self.cache
            .lock()
            .expect("cache")
            .insert(expression.to_string(), compiled.clone());
        compiled
    }

    /// [`Self::compile_uncached`] on a stack of [`COMPILE_STACK`] (on the
    /// caller's if no thread can be started).
    fn compile_on_own_stack(&self, expression: &str) -> Result<Selector, CompileError> {
        let compile = || self.compile_uncached(expression);
        std::thread::scope(|scope| {
            match std::thread::Builder::new()
                .name("cel-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, compile)
            {
                Ok(compiler) => compiler
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => compile(),
            }
        })
    }

    fn compile_uncached(&self, expression: &str) -> Result<Selector, CompileError> {
        if expression.chars().count() > MAX_EXPRESSION_LENGTH {
            return Err(CompileError::TooLong {
                length: expression.chars().count(),
            });
        }
        let program = parse(&self.env, expression)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::Device;

    /// Found by the `cel` fuzz target: a 10 Ki-character chain of `+`
    /// overflowed a 2 MiB stack (a tokio worker's) in the cost estimate, one
    /// of selections in the parser. Kubernetes refuses such chains at its
    /// parser's recursion depth; so does this build now, called on such a
    /// stack, and it still compiles the longest chain Kubernetes does.
    #[test]
    fn chains_deeper_than_kubernetes_parses_are_refused_on_a_small_stack() {
        let chains = [
            format!("{} == 1", ["1"; 5000].join("+")),
            format!("device{} == 1", ".a".repeat(5000)),
            format!("[1]{} == 1", "[0]".repeat(3000)),
            ["true"; 1700].join("=="),
            format!("'a'{} == 'a'", ".lowerAscii()".repeat(780)),
        ];
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let compiler = Compiler::default();
                for chain in &chains {
                    assert!(chain.chars().count() <= MAX_EXPRESSION_LENGTH);
                    let err = compiler.eval(chain, &Device::default()).unwrap_err();
                    assert_eq!(
                        err.to_string(),
                        "compilation failed: ERROR: <input>:-1:0: max recursion depth exceeded",
                        "{}...",
                        &chain[..40]
                    );
                }
                // Kubernetes: compiled, at a worst-case cost of 250.
                let longest = format!("{} == 250", ["1"; 250].join("+"));
                let compiled = compiler.compile(&longest);
                assert_eq!(compiled.as_ref().as_ref().unwrap().max_cost(), Some(250));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
