//! The worst-case cost of a selector, as the API server estimates it before
//! it stores one (`env.EstimateCost` with Kubernetes' cost estimator and the
//! DRA size estimator) and compares it with `CELSelectorExpressionMaxCost`.
//!
//! The estimate follows cel-go's rules: constants cost 0, identifiers and
//! selections on maps and objects 1, a call 1 plus its arguments unless the
//! function has its own rule (string comparison and traversal at 0.1 a
//! character, regexes at 0.25 a pattern character, Kubernetes' library
//! functions), `&&` / `||` the sum of their sides, a comprehension its range's
//! size times the cost of one step. Sizes come from literals, from the limits
//! of a device (63-character domains, 32 attributes a domain, 64-character
//! attribute values, 63-character driver names) and from what the functions
//! return.
//!
//! The estimate covers the standard library, the string, list and set
//! extensions, Kubernetes' quantity, semver, list and regex libraries,
//! DRA's `includes`, optional types, `cel.bind` and the comprehension
//! macros, `sortBy` included. For anything else it answers `None` (not estimated).

use std::collections::HashMap;

use cel::common::ast::{
    ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr, SelectExpr,
};

/// `resourceapi.CELSelectorExpressionMaxCost`.
pub const MAX_COST: u64 = 1_000_000;

const STRING_TRAVERSAL: f64 = 0.1;
const REGEX_LENGTH: f64 = 0.25;
const LIST_CREATE: u64 = 10;
const MAP_CREATE: u64 = 30;
/// Limits of the `device` variable's fields (k8s.io/api/resource/v1).
const DOMAIN_LENGTH: u64 = 63;
const ID_LENGTH: u64 = 32;
const DRIVER_LENGTH: u64 = 63;
const ATTRIBUTES_PER_DEVICE: u64 = 32;
const ATTRIBUTE_VALUE_LENGTH: u64 = 64;

/// A range, as cel-go keeps both ends of costs and sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Est {
    min: u64,
    max: u64,
}

const UNKNOWN: Est = Est {
    min: 0,
    max: u64::MAX,
};

impl Est {
    fn fixed(n: u64) -> Est {
        Est { min: n, max: n }
    }
    fn add(self, o: Est) -> Est {
        Est {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    fn mul(self, o: Est) -> Est {
        Est {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    fn factor(self, f: f64) -> Est {
        Est {
            min: by_factor(self.min, f),
            max: by_factor(self.max, f),
        }
    }
    fn union(self, o: Est) -> Est {
        Est {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
}

/// cel-go's `multiplyByCostFactor`: the ceiling, saturating.
fn by_factor(x: u64, f: f64) -> u64 {
    let x = x as f64;
    if x > 0.0 && f > 0.0 && x > u64::MAX as f64 / f {
        return u64::MAX;
    }
    let product = (x * f).ceil();
    if product >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        product as u64
    }
}

/// The checker's types, as far as costs depend on them.
#[derive(Clone, Debug, PartialEq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    /// `google.protobuf.Any`: a device attribute's value.
    Any,
    Dyn,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Device,
    Quantity,
    Semver,
    Optional(Box<Ty>),
}

impl Ty {
    fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn | Ty::Any)
    }
    /// Could be a string (or bytes): the string rules apply.
    fn stringish(&self) -> bool {
        matches!(self, Ty::String | Ty::Bytes) || self.is_dyn()
    }
    fn scalar(&self) -> bool {
        match self {
            Ty::Bool | Ty::Double | Ty::Int | Ty::Uint => true,
            Ty::Optional(t) => t.scalar(),
            _ => false,
        }
    }

    fn elem(&self) -> Ty {
        match self {
            Ty::List(t) => (**t).clone(),
            _ => Ty::Dyn,
        }
    }
}

/// A container's key and value sizes, where an expression built it.
#[derive(Clone, Copy, Debug)]
struct Entry {
    list: bool,
    key: Est,
    val: Est,
}

impl Entry {
    fn union(a: Option<Entry>, b: Option<Entry>) -> Option<Entry> {
        let (a, b) = (a?, b?);
        Some(Entry {
            list: a.list,
            key: a.key.union(b.key),
            val: a.val.union(b.val),
        })
    }
}

struct Local {
    path: Vec<String>,
    size: Option<Est>,
    entry: Option<Entry>,
    ty: Ty,
}

/// The estimate's bookkeeping, by expression id.
#[derive(Default)]
struct Coster {
    types: HashMap<u64, Ty>,
    paths: HashMap<u64, Vec<String>>,
    sizes: HashMap<u64, Est>,
    entries: HashMap<u64, Entry>,
    locals: HashMap<String, Vec<Local>>,
    /// Set when the expression uses something not estimated here.
    outside: bool,
    /// A call no overload takes, or a literal mixing types, as the type
    /// checker finds it.
    type_error: Option<String>,
}

/// Kubernetes' type checker wants the elements of a list literal (and the
/// keys, and the values, of a map literal) of one type
/// (`HomogeneousAggregateLiterals`): the first known type, which every other
/// known one must be. An element typed `dyn` by a `dyn()` call counts as the
/// type `dyn`; one whose type is not known here is let pass.
#[derive(Default)]
struct Homogeneous {
    first: Option<String>,
    /// The elements' type: `dyn` once two differ.
    common: Option<Ty>,
}

impl Homogeneous {
    fn check(&mut self, x: &IdedExpr, t: &Ty, error: &mut Option<String>) {
        let explicit_dyn =
            matches!(&x.expr, Expr::Call(c) if c.func_name == "dyn" && c.target.is_none());
        match &self.common {
            None => self.common = Some(t.clone()),
            Some(c) if c != t => self.common = Some(Ty::Dyn),
            Some(_) => {}
        }
        let name = if explicit_dyn {
            "dyn".to_string()
        } else if t.is_known() || *t == Ty::Any {
            t.name()
        } else {
            return;
        };
        match &self.first {
            None => self.first = Some(name),
            Some(first) if *first != name && error.is_none() => {
                *error = Some(format!("expected type '{first}' but found '{name}'"));
            }
            Some(_) => {}
        }
    }

    /// The elements' type, `dyn` where they differ or there are none.
    fn common(self) -> Ty {
        self.common.unwrap_or(Ty::Dyn)
    }
}

/// The worst-case cost of a compiled selector, or `None` where it uses a
/// library this estimate does not cover; an error where the types the
/// estimate follows show a call no overload takes or a literal mixing types
/// (Kubernetes' type checker refuses both).
pub(crate) fn max_cost(e: &IdedExpr) -> Result<Option<u64>, String> {
    let mut c = Coster::default();
    let cost = c.cost(e);
    match c.type_error {
        Some(message) => Err(message),
        None => Ok((!c.outside).then_some(cost.max)),
    }
}

impl Ty {
    /// Whether the type checker knows the type (not `dyn`, not an attribute's).
    fn is_known(&self) -> bool {
        match self {
            Ty::Dyn | Ty::Any => false,
            Ty::List(t) | Ty::Optional(t) => t.is_known(),
            Ty::Map(k, v) => k.is_known() && v.is_known(),
            _ => true,
        }
    }

    /// The type's name as CEL writes it.
    fn name(&self) -> String {
        match self {
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::Bytes => "bytes".into(),
            Ty::Null => "null_type".into(),
            Ty::Any => "any".into(),
            Ty::Dyn => "dyn".into(),
            Ty::List(t) => format!("list({})", t.name()),
            Ty::Map(k, v) => format!("map({}, {})", k.name(), v.name()),
            Ty::Device => "device".into(),
            Ty::Quantity => "kubernetes.Quantity".into(),
            Ty::Semver => "kubernetes.Semver".into(),
            Ty::Optional(t) => format!("optional_type({})", t.name()),
        }
    }
}

/// A call being estimated: its function, what it is called on and with,
/// and what its arguments cost.
struct Call<'e> {
    /// The call's expression.
    id: u64,
    /// The function, a global's with its namespace (`sets.contains`).
    name: &'e str,
    /// What it is called on (none for a namespaced global).
    target: Option<&'e IdedExpr>,
    args: &'e [IdedExpr],
    /// 1 plus the arguments: a call with no rule of its own.
    default: Est,
    arg_costs: Vec<Est>,
    arg_sum: Est,
    /// The arguments' types, and the target's.
    types: Vec<Ty>,
    target_ty: Option<Ty>,
}

/// What a function's own rule says of a call: what it costs, arguments
/// included, and its result's type and (where the rule knows it) size.
struct Rule {
    cost: Est,
    ty: Ty,
    size: Option<Est>,
}

fn is_accumulator(name: &str) -> bool {
    name == "@result" || name == "@__result__"
}

impl Coster {
    fn ty(&self, e: &IdedExpr) -> Ty {
        self.types.get(&e.id).cloned().unwrap_or(Ty::Dyn)
    }

    fn set_ty(&mut self, e: &IdedExpr, t: Ty) {
        self.types.insert(e.id, t);
    }

    fn local(&self, name: &str) -> Option<&Local> {
        self.locals.get(name).and_then(|s| s.last())
    }

    fn push(&mut self, name: &str, local: Local) {
        self.locals.entry(name.to_string()).or_default().push(local);
    }

    fn pop(&mut self, name: &str) {
        if let Some(stack) = self.locals.get_mut(name) {
            stack.pop();
        }
    }

    fn path(&self, e: &IdedExpr) -> Vec<String> {
        if let Expr::Ident(name) = &e.expr
            && let Some(v) = self.local(name)
        {
            return v.path.clone();
        }
        self.paths.get(&e.id).cloned().unwrap_or_default()
    }

    /// The DRA size estimator: the limits of what `device` holds.
    fn device_size(path: &[String]) -> Option<Est> {
        let (root, rest) = path.split_first()?;
        if root != "device" {
            return None;
        }
        #[derive(Clone, Copy, PartialEq)]
        enum Node {
            Device,
            Driver,
            Multi,
            Outer { capacity: bool },
            Inner { capacity: bool },
            Value,
            Quantity,
            Domain,
            Id,
        }
        let mut node = Node::Device;
        for name in rest {
            node = match (node, name.as_str()) {
                (Node::Outer { capacity }, "@values") => Node::Inner { capacity },
                (Node::Outer { .. }, "@keys") => Node::Domain,
                (Node::Inner { capacity: false }, "@keys") => Node::Id,
                (Node::Inner { capacity: true }, "@keys") => Node::Id,
                (Node::Inner { capacity: false }, _) => Node::Value,
                (Node::Inner { capacity: true }, "@values") => Node::Quantity,
                (Node::Device, "driver") => Node::Driver,
                (Node::Device, "allowMultipleAllocations") => Node::Multi,
                (Node::Device, "attributes") => Node::Outer { capacity: false },
                (Node::Device, "capacity") => Node::Outer { capacity: true },
                _ => return None,
            };
        }
        let max = match node {
            Node::Device | Node::Quantity => 0,
            Node::Driver => DRIVER_LENGTH,
            Node::Multi => 1,
            Node::Outer { .. } | Node::Inner { .. } => ATTRIBUTES_PER_DEVICE,
            Node::Value => ATTRIBUTE_VALUE_LENGTH,
            Node::Domain => DOMAIN_LENGTH,
            Node::Id => ID_LENGTH,
        };
        Some(Est { min: 0, max })
    }

    /// cel-go's `computeSize`.
    fn size(&mut self, e: &IdedExpr) -> Option<Est> {
        if let Some(s) = self.sizes.get(&e.id) {
            return Some(*s);
        }
        let literal = match &e.expr {
            Expr::Literal(LiteralValue::String(s)) => Some(s.inner().chars().count() as u64),
            Expr::Literal(LiteralValue::Bytes(b)) => Some(b.len() as u64),
            Expr::Literal(
                LiteralValue::Boolean(_)
                | LiteralValue::Int(_)
                | LiteralValue::UInt(_)
                | LiteralValue::Double(_)
                | LiteralValue::Null,
            ) => Some(1),
            Expr::List(l) => Some(l.elements.len() as u64),
            Expr::Map(m) => Some(m.entries.len() as u64),
            _ => None,
        };
        if let Some(n) = literal {
            return Some(Est::fixed(n));
        }
        if let Some(s) = Self::device_size(&self.path(e)) {
            self.sizes.insert(e.id, s);
            return Some(s);
        }
        if self.ty(e).scalar() {
            return Some(Est::fixed(1));
        }
        if let Expr::Ident(name) = &e.expr {
            return self.local(name).and_then(|v| v.size);
        }
        None
    }

    fn size_or_unknown(&mut self, e: &IdedExpr) -> Est {
        self.size(e).unwrap_or(UNKNOWN)
    }

    fn entry(&self, e: &IdedExpr) -> Option<Entry> {
        if let Some(s) = self.entries.get(&e.id) {
            return Some(*s);
        }
        if let Expr::Ident(name) = &e.expr {
            return self.local(name).and_then(|v| v.entry);
        }
        None
    }

    /// The size of a list's elements: known only where the list is a device
    /// path (Kubernetes' `listElementNode`).
    fn items_size(&self, list: &IdedExpr) -> Est {
        let mut items = self.path(list);
        if items.is_empty() {
            return UNKNOWN;
        }
        items.push("@items".into());
        Self::device_size(&items).unwrap_or(UNKNOWN)
    }

    fn cost(&mut self, e: &IdedExpr) -> Est {
        match &e.expr {
            Expr::Literal(l) => {
                let t = match l {
                    LiteralValue::Boolean(_) => Ty::Bool,
                    LiteralValue::Int(_) => Ty::Int,
                    LiteralValue::UInt(_) => Ty::Uint,
                    LiteralValue::Double(_) => Ty::Double,
                    LiteralValue::String(_) => Ty::String,
                    LiteralValue::Bytes(_) => Ty::Bytes,
                    LiteralValue::Null => Ty::Null,
                };
                self.set_ty(e, t);
                Est::fixed(0)
            }
            Expr::Ident(name) => self.ident(e, name),
            Expr::Select(sel) => self.select(e, sel),
            Expr::List(l) => self.list(e, l),
            Expr::Map(m) => self.map(e, m),
            Expr::Comprehension(c) => self.comprehension(e, c),
            Expr::Call(_) => self.call(e),
            Expr::Struct(_) | Expr::Unspecified => {
                self.outside = true;
                Est::fixed(0)
            }
        }
    }

    fn ident(&mut self, e: &IdedExpr, name: &str) -> Est {
        let (path, t) = match self.local(name) {
            Some(v) => (v.path.clone(), v.ty.clone()),
            None if name == "device" => (vec![name.to_string()], Ty::Device),
            None => {
                self.outside = true;
                (vec![name.to_string()], Ty::Dyn)
            }
        };
        self.paths.insert(e.id, path);
        self.set_ty(e, t);
        Est::fixed(1)
    }

    fn select(&mut self, e: &IdedExpr, sel: &SelectExpr) -> Est {
        let mut sum = self.cost(&sel.operand);
        if sel.test {
            // Kubernetes keeps has() free (PresenceTestHasCost(false)).
            self.set_ty(e, Ty::Bool);
            return sum;
        }
        let operand = self.ty(&sel.operand);
        let t = match (&operand, sel.field.as_str()) {
            (Ty::Device, "driver") => Ty::String,
            (Ty::Device, "allowMultipleAllocations") => Ty::Bool,
            (Ty::Device, "attributes") => Ty::Map(
                Box::new(Ty::String),
                Box::new(Ty::Map(Box::new(Ty::String), Box::new(Ty::Any))),
            ),
            (Ty::Device, "capacity") => Ty::Map(
                Box::new(Ty::String),
                Box::new(Ty::Map(Box::new(Ty::String), Box::new(Ty::Quantity))),
            ),
            (Ty::Map(_, v), _) => (**v).clone(),
            _ => Ty::Dyn,
        };
        if matches!(operand, Ty::Map(..) | Ty::Device) {
            sum = sum.add(Est::fixed(1));
        }
        let mut path = self.path(&sel.operand);
        path.push(sel.field.clone());
        self.paths.insert(e.id, path);
        self.set_ty(e, t);
        sum
    }

    fn list(&mut self, e: &IdedExpr, l: &ListExpr) -> Est {
        let mut sum = Est::fixed(0);
        let mut item = Est {
            min: if l.elements.is_empty() { 0 } else { u64::MAX },
            max: 0,
        };
        let mut elems = Homogeneous::default();
        for x in &l.elements {
            sum = sum.add(self.cost(x));
            item = item.union(self.size_or_unknown(x));
            let t = self.ty(x);
            elems.check(x, &t, &mut self.type_error);
        }
        if !l.optional_indices.is_empty() {
            self.outside = true;
        }
        self.entries.insert(
            e.id,
            Entry {
                list: true,
                key: Est::fixed(1),
                val: item,
            },
        );
        self.set_ty(e, Ty::List(Box::new(elems.common())));
        sum.add(Est::fixed(LIST_CREATE))
    }

    fn map(&mut self, e: &IdedExpr, m: &MapExpr) -> Est {
        let mut sum = Est::fixed(0);
        let empty = m.entries.is_empty();
        let start = Est {
            min: if empty { 0 } else { u64::MAX },
            max: 0,
        };
        let (mut key, mut val) = (start, start);
        let (mut keys, mut values) = (Homogeneous::default(), Homogeneous::default());
        for entry in &m.entries {
            let EntryExpr::MapEntry(entry) = &entry.expr else {
                self.outside = true;
                continue;
            };
            if entry.optional {
                self.outside = true;
            }
            sum = sum.add(self.cost(&entry.key)).add(self.cost(&entry.value));
            let (k, v) = (self.ty(&entry.key), self.ty(&entry.value));
            keys.check(&entry.key, &k, &mut self.type_error);
            values.check(&entry.value, &v, &mut self.type_error);
            key = key.union(self.size_or_unknown(&entry.key));
            val = val.union(self.size_or_unknown(&entry.value));
        }
        self.entries.insert(
            e.id,
            Entry {
                list: false,
                key,
                val,
            },
        );
        self.set_ty(
            e,
            Ty::Map(Box::new(keys.common()), Box::new(values.common())),
        );
        sum.add(Est::fixed(MAP_CREATE))
    }

    /// A comprehension: its range's size times one step, or (`cel.bind`) its
    /// accumulator's and result's costs.
    fn comprehension(&mut self, e: &IdedExpr, c: &ComprehensionExpr) -> Est {
        let is_bind = matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty())
            && matches!(&c.loop_cond.expr, Expr::Literal(LiteralValue::Boolean(b)) if !*b.inner())
            && !is_accumulator(&c.accu_var);
        let mut sum = self.cost(&c.iter_range).add(self.cost(&c.accu_init));
        let init_ty = self.ty(&c.accu_init);
        let accu = Local {
            path: self.path(&c.accu_init),
            size: self.size(&c.accu_init),
            entry: self.entry(&c.accu_init),
            ty: init_ty.clone(),
        };
        self.push(&c.accu_var, accu);
        if is_bind {
            return self.bind(e, c, sum);
        }
        if c.iter_var2.is_some() {
            self.outside = true;
        }
        let range_ty = self.ty(&c.iter_range);
        self.check_range(&range_ty);
        let iter_var = self.iteration_variable(c, &range_ty);
        self.push(&c.iter_var, iter_var);
        let loop_cost = self.cost(&c.loop_cond);
        let step_cost = self.cost(&c.loop_step);
        self.pop(&c.iter_var);
        sum = sum.add(self.cost(&c.result));
        self.pop(&c.accu_var);
        let range = self.size_or_unknown(&c.iter_range);
        sum = sum.add(range.mul(step_cost.add(loop_cost)));
        self.comprehension_result(e, c, init_ty, range);
        sum
    }

    /// `cel.bind`: the result, with the bound variable (the accumulator,
    /// pushed) in scope; its size and type are the comprehension's.
    fn bind(&mut self, e: &IdedExpr, c: &ComprehensionExpr, sum: Est) -> Est {
        let sum = sum.add(self.cost(&c.result));
        self.pop(&c.accu_var);
        if let Some(s) = self.size(&c.result) {
            self.sizes.insert(e.id, s);
        }
        if let Some(s) = self.entry(&c.result) {
            self.entries.insert(e.id, s);
        }
        let t = self.ty(&c.result);
        self.set_ty(e, t);
        sum
    }

    /// The type checker ranges over lists, maps and `dyn` only: an
    /// attribute's value (`any`), a quantity, a string... is refused when the
    /// selector is compiled, not when it is evaluated.
    fn check_range(&mut self, range_ty: &Ty) {
        if !matches!(range_ty, Ty::List(_) | Ty::Map(..) | Ty::Dyn) && self.type_error.is_none() {
            let name = match range_ty {
                Ty::Null => "null".to_string(),
                Ty::Device => "kubernetes.DRADevice".to_string(),
                t => t.name(),
            };
            self.type_error = Some(format!(
                "expression of type '{name}' cannot be range of a comprehension (must be list, map, or dynamic)"
            ));
        }
    }

    /// The iteration variable: a list's items or a map's keys, with their
    /// size where the range was built here.
    fn iteration_variable(&mut self, c: &ComprehensionExpr, range_ty: &Ty) -> Local {
        let range_entry = self.entry(&c.iter_range);
        let list = match range_entry {
            Some(entry) => entry.list,
            None => matches!(range_ty, Ty::List(_)),
        };
        let (subpath, size, var_ty) = if list {
            let elem = match range_ty {
                Ty::List(t) => (**t).clone(),
                _ => Ty::Dyn,
            };
            ("@items", range_entry.map(|x| x.val), elem)
        } else {
            let key = match range_ty {
                Ty::Map(k, _) => (**k).clone(),
                _ => Ty::Dyn,
            };
            ("@keys", range_entry.map(|x| x.key), key)
        };
        let mut path = self.path(&c.iter_range);
        path.push(subpath.into());
        Local {
            path,
            size,
            entry: None,
            ty: var_ty,
        }
    }

    /// The comprehension's size and type: a literal accumulator's, or for a
    /// list or map built step by step, the range's size.
    fn comprehension_result(
        &mut self,
        e: &IdedExpr,
        c: &ComprehensionExpr,
        init_ty: Ty,
        range: Est,
    ) {
        match &c.accu_init.expr {
            Expr::Literal(_) => {
                if let Some(s) = self.size(&c.accu_init) {
                    self.sizes.insert(e.id, s);
                }
            }
            Expr::List(_) | Expr::Map(_) => {
                self.sizes.insert(e.id, range);
                if let Some(s) = self.entry(&c.loop_step) {
                    self.entries.insert(e.id, s);
                }
            }
            _ => {}
        }
        let t = match (&c.accu_init.expr, init_ty) {
            (Expr::List(_), _) => {
                let elem = match self.ty(&c.loop_step) {
                    Ty::List(t) => *t,
                    _ => Ty::Dyn,
                };
                Ty::List(Box::new(elem))
            }
            _ => self.ty(&c.result),
        };
        self.set_ty(e, t);
    }

    fn call(&mut self, e: &IdedExpr) -> Est {
        let Expr::Call(call) = &e.expr else {
            unreachable!("a call")
        };
        // `sets.contains(a, b)`, `lists.range(n)`, `optional.of(x)`: global
        // functions with a dotted name, not calls on a target.
        let namespace = match call.target.as_deref().map(|t| &t.expr) {
            Some(Expr::Ident(ns))
                if matches!(ns.as_str(), "sets" | "lists" | "optional" | "strings")
                    && self.local(ns).is_none() =>
            {
                Some(ns.as_str())
            }
            _ => None,
        };
        let dotted;
        let name = match namespace {
            Some(ns) => {
                dotted = format!("{ns}.{}", call.func_name);
                dotted.as_str()
            }
            None => call.func_name.as_str(),
        };
        let arg_costs: Vec<Est> = call.args.iter().map(|a| self.cost(a)).collect();
        let arg_sum = arg_costs.iter().fold(Est::fixed(0), |s, c| s.add(*c));
        let mut sum = Est::fixed(0);
        let target = call.target.as_deref().filter(|_| namespace.is_none());
        if let Some(target) = target {
            sum = sum.add(self.cost(target));
        }
        let args = &call.args;
        let types: Vec<Ty> = args.iter().map(|a| self.ty(a)).collect();
        let target_ty = target.map(|t| self.ty(t));
        let call = Call {
            id: e.id,
            name,
            target,
            args,
            default: Est::fixed(1).add(arg_sum),
            arg_costs,
            arg_sum,
            types,
            target_ty,
        };
        let rule = Self::RULES.iter().find_map(|rule| rule(self, &call));
        let Rule { cost, ty, size } = rule.unwrap_or_else(|| {
            // Nothing else a selector may call.
            self.outside = true;
            Rule {
                cost: call.default,
                ty: Ty::Dyn,
                size: None,
            }
        });
        if let Some(size) = size {
            self.sizes.insert(e.id, size);
        }
        self.set_ty(e, ty);
        sum.add(cost)
    }

    /// The functions with cost rules of their own, by library; the first
    /// rule that knows a call estimates it.
    const RULES: [fn(&mut Coster, &Call<'_>) -> Option<Rule>; 10] = [
        Coster::logic_and_comparisons,
        Coster::arithmetic_and_indexing,
        Coster::conversions,
        Coster::string_search,
        Coster::string_building,
        Coster::quantities_and_semvers,
        Coster::optionals,
        Coster::set_functions,
        Coster::allocating_list_functions,
        Coster::list_traversals,
    ];

    /// `&&` and `||`, negation, the conditional, equality and ordering.
    fn logic_and_comparisons(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            id,
            name,
            target,
            args,
            ref arg_costs,
            arg_sum,
            ref types,
            default,
            ..
        } = *call;
        let mut result_size = None;
        let (cost, ty) = match (name, target, args) {
            ("_&&_" | "_||_", None, [_, _]) => (
                Est {
                    min: arg_costs[0].min,
                    max: arg_costs[0].add(arg_costs[1]).max,
                },
                Ty::Bool,
            ),
            ("!_" | "@not_strictly_false", None, [_]) => (default, Ty::Bool),
            ("-_", None, [_]) => (default, types[0].clone()),
            ("_?_:_", None, [_, a, b]) => {
                let size = self.size_or_unknown(a).union(self.size_or_unknown(b));
                if let Some(entry) = Entry::union(self.entry(a), self.entry(b)) {
                    self.entries.insert(id, entry);
                }
                result_size = Some(size);
                let t = if types[1] == types[2] {
                    types[1].clone()
                } else {
                    Ty::Dyn
                };
                (arg_costs[0].add(arg_costs[1].union(arg_costs[2])), t)
            }
            ("_==_", None, [_, _])
                if types[0] == types[1] && matches!(types[0], Ty::Quantity | Ty::Semver) =>
            {
                (default, Ty::Bool)
            }
            ("_==_" | "_!=_", None, [a, b]) => (self.compare_strings(a, b).add(arg_sum), Ty::Bool),
            ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b]) => {
                // Every overload the argument types allow: strings and
                // bytes by length, the others 1.
                let strings = types[0].stringish() && types[1].stringish();
                let others = !(matches!(types[0], Ty::String | Ty::Bytes)
                    || matches!(types[1], Ty::String | Ty::Bytes));
                let mut cost = None::<Est>;
                if strings {
                    cost = Some(self.compare_strings(a, b).add(arg_sum));
                }
                if others {
                    cost = Some(cost.map_or(default, |c| c.union(default)));
                }
                (cost.unwrap_or(default), Ty::Bool)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// `+` (strings, bytes, lists and numbers), the other arithmetic, `in`
    /// and indexing.
    fn arithmetic_and_indexing(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            id,
            name,
            target,
            args,
            arg_sum,
            ref types,
            default,
            ..
        } = *call;
        let mut result_size = None;
        let (cost, ty) = match (name, target, args) {
            ("_+_", None, [a, b]) => {
                let (lhs, rhs) = (&types[0], &types[1]);
                let both = |f: fn(&Ty) -> bool| f(lhs) && f(rhs);
                let mut cost = None::<Est>;
                let mut unite = |c: Est| cost = Some(cost.map_or(c, |x: Est| x.union(c)));
                let sized = self.size_or_unknown(a).add(self.size_or_unknown(b));
                if both(|t| matches!(t, Ty::String | Ty::Bytes) || t.is_dyn()) {
                    unite(sized.factor(STRING_TRAVERSAL).add(arg_sum));
                    result_size = Some(sized);
                }
                if both(|t| matches!(t, Ty::List(_)) || t.is_dyn()) {
                    unite(default);
                    result_size = Some(sized);
                    if let Some(entry) = Entry::union(self.entry(a), self.entry(b)) {
                        self.entries.insert(id, entry);
                    }
                }
                if both(|t| matches!(t, Ty::Int | Ty::Uint | Ty::Double) || t.is_dyn()) {
                    unite(default);
                }
                // Two lists: the one whose element type is known.
                let t = match (lhs, rhs) {
                    _ if lhs == rhs => lhs.clone(),
                    (Ty::List(x), Ty::List(_)) if **x != Ty::Dyn => lhs.clone(),
                    (Ty::List(_), Ty::List(_)) => rhs.clone(),
                    _ => Ty::Dyn,
                };
                (cost.unwrap_or(default), t)
            }
            ("_-_" | "_*_" | "_/_" | "_%_", None, [_, _]) => {
                let t = if types[0] == types[1] {
                    types[0].clone()
                } else {
                    Ty::Dyn
                };
                (default, t)
            }
            ("@in", None, [_, b]) => {
                let list = self.size_or_unknown(b).factor(1.0).add(arg_sum);
                let cost = match &types[1] {
                    Ty::List(_) => list,
                    Ty::Map(..) => default,
                    _ => list.union(default),
                };
                (cost, Ty::Bool)
            }
            ("_[_]", None, [m, _]) => {
                let container = &types[0];
                let map = !matches!(container, Ty::List(_));
                // With both overloads possible, the map's is the last cel-go sees.
                result_size = self.entry(m).map(|x| x.val);
                let mut path = self.path(m);
                path.push(if map { "@values" } else { "@items" }.into());
                self.paths.insert(id, path);
                let t = match container {
                    Ty::List(t) => (**t).clone(),
                    Ty::Map(_, v) => (**v).clone(),
                    _ => Ty::Dyn,
                };
                (default, t)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// The type conversions, `size` and `dyn`.
    fn conversions(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            id,
            name,
            target,
            args,
            arg_sum,
            ref types,
            default,
            ..
        } = *call;
        let mut result_size = None;
        let (cost, ty) = match (name, target, args) {
            ("size", _, _) => (default, Ty::Int),
            ("int", None, [_]) => (default, Ty::Int),
            ("uint", None, [_]) => (default, Ty::Uint),
            ("double", None, [_]) => (default, Ty::Double),
            ("string", None, [x]) => {
                // Of the conversions, bytes to string has a cost and a size.
                let t = &types[0];
                if matches!(t, Ty::Bytes) || t.is_dyn() {
                    let size = self.size_or_unknown(x);
                    result_size = Some(Est {
                        min: size.min / 4,
                        max: size.max,
                    });
                    let bytes = size.factor(STRING_TRAVERSAL).add(arg_sum);
                    let cost = if t.is_dyn() {
                        bytes.union(default)
                    } else {
                        bytes
                    };
                    (cost, Ty::String)
                } else {
                    (default, Ty::String)
                }
            }
            ("bool", None, [_]) => (default, Ty::Bool),
            // `dyn(x)`: an O(1) call whose result the checker knows nothing
            // of, but cel-go's coster unwraps it: `x`'s sizes carry over.
            ("dyn", None, [x]) => {
                result_size = self.size(x);
                if let Some(entry) = self.entry(x) {
                    self.entries.insert(id, entry);
                }
                (default, Ty::Dyn)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// Matching and searching strings: regexes, `contains`, prefixes and
    /// suffixes, positions.
    fn string_search(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            ref target_ty,
            default,
            ..
        } = *call;
        let one = Est::fixed(1);
        let mut result_size = None;
        let (cost, ty) = match (name, target, args) {
            ("matches", Some(t), [pattern]) => {
                let s = self.size_or_unknown(t).add(one).factor(STRING_TRAVERSAL);
                let r = self.size_or_unknown(pattern).factor(REGEX_LENGTH);
                (s.mul(r).add(arg_sum), Ty::Bool)
            }
            ("matches", None, [_, _]) => (default, Ty::Bool),
            ("contains", Some(t), [sub]) if target_ty.as_ref().is_some_and(Ty::stringish) => {
                let s = self.size_or_unknown(t).factor(STRING_TRAVERSAL);
                let x = self.size_or_unknown(sub).factor(STRING_TRAVERSAL);
                (s.mul(x).add(arg_sum), Ty::Bool)
            }
            ("startsWith" | "endsWith", Some(_), [x]) => (
                self.size_or_unknown(x)
                    .factor(STRING_TRAVERSAL)
                    .add(arg_sum),
                Ty::Bool,
            ),
            ("indexOf" | "lastIndexOf", Some(t), _)
                if target_ty.as_ref().is_some_and(Ty::stringish) =>
            {
                let size = self.size_or_unknown(t);
                (size.factor(STRING_TRAVERSAL).add(arg_sum), Ty::Int)
            }
            ("charAt", Some(_), [_]) => (default, Ty::String),
            ("find" | "findAll", Some(t), [pattern, ..]) => {
                let size = self.size_or_unknown(t);
                let s = size.add(one).factor(STRING_TRAVERSAL);
                let r = self.size_or_unknown(pattern).factor(REGEX_LENGTH);
                result_size = Some(Est {
                    min: 0,
                    max: size.max,
                });
                let t = if name == "find" {
                    Ty::String
                } else {
                    Ty::List(Box::new(Ty::String))
                };
                (s.mul(r).add(arg_sum), t)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// The string functions that build a string (or a list of them): their
    /// result's size follows from their target's.
    fn string_building(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            ..
        } = *call;
        let result_size;
        let (cost, ty) = match (name, target, args) {
            ("lowerAscii" | "upperAscii" | "substring" | "trim", Some(t), _) => {
                let size = self.size_or_unknown(t);
                result_size = Some(size);
                (size.factor(STRING_TRAVERSAL).add(arg_sum), Ty::String)
            }
            ("replace", Some(t), [from, to, ..]) => {
                let size = self.size_or_unknown(t);
                let from = self.size_or_unknown(from);
                let to = self.size_or_unknown(to);
                result_size = Some(replaced_size(size, from, to));
                (size.factor(2.0 * STRING_TRAVERSAL).add(arg_sum), Ty::String)
            }
            ("split", Some(t), _) => {
                let size = self.size_or_unknown(t);
                let mut max = size.max;
                if let Some(Expr::Literal(LiteralValue::Int(n))) = args.get(1).map(|a| &a.expr) {
                    max = *n.inner() as u64;
                }
                result_size = Some(Est { min: 0, max });
                (
                    size.factor(2.0 * STRING_TRAVERSAL).add(arg_sum),
                    Ty::List(Box::new(Ty::String)),
                )
            }
            ("join", Some(t), _) => {
                let list = self.size_or_unknown(t);
                let elem = self.items_size(t);
                let mut size = list.mul(elem);
                if let Some(sep) = args.first() {
                    let sep = self.size_or_unknown(sep);
                    let seps = Est {
                        min: list.min.saturating_sub(1),
                        max: list.max.saturating_sub(1),
                    };
                    size = size.add(sep.mul(seps));
                }
                result_size = Some(size);
                (size.factor(STRING_TRAVERSAL).add(arg_sum), Ty::String)
            }
            // `strings.quote(s)`: one traversal; every character may be
            // escaped, and the quotes are added.
            ("strings.quote", None, [a]) => {
                let size = self.size_or_unknown(a);
                result_size = Some(Est {
                    min: size.min.saturating_add(2),
                    max: size.max.saturating_mul(2).saturating_add(2),
                });
                (size.factor(STRING_TRAVERSAL).add(arg_sum), Ty::String)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// Kubernetes' quantity and semver libraries.
    fn quantities_and_semvers(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            default,
            ..
        } = *call;
        let (cost, ty) = match (name, target, args) {
            ("quantity" | "isQuantity" | "semver" | "isSemver", None, [x, ..]) => {
                let t = match name {
                    "quantity" => Ty::Quantity,
                    "semver" => Ty::Semver,
                    _ => Ty::Bool,
                };
                (
                    self.size_or_unknown(x)
                        .factor(STRING_TRAVERSAL)
                        .add(arg_sum),
                    t,
                )
            }
            (
                "asInteger" | "isInteger" | "asApproximateFloat" | "isGreaterThan" | "isLessThan"
                | "compareTo" | "add" | "sub" | "major" | "minor" | "patch" | "sign",
                Some(_),
                _,
            ) => {
                let t = match name {
                    "asInteger" | "compareTo" | "major" | "minor" | "patch" | "sign" => Ty::Int,
                    "asApproximateFloat" => Ty::Double,
                    "add" | "sub" => Ty::Quantity,
                    _ => Ty::Bool,
                };
                (default, t)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: None,
        })
    }

    /// Optional types, and the optional library's list functions.
    fn optionals(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            ref types,
            ref target_ty,
            default,
            ..
        } = *call;
        let (cost, ty) = match (name, target, args) {
            // Optional types: no cost rules of their own.
            ("_?._", None, [_, field]) => {
                let field = match &field.expr {
                    Expr::Literal(LiteralValue::String(f)) => f.inner().to_string(),
                    _ => String::new(),
                };
                let t = match (&types[0], field.as_str()) {
                    (Ty::Map(_, v), _) => (**v).clone(),
                    (Ty::Device, "driver") => Ty::String,
                    _ => Ty::Dyn,
                };
                (default, Ty::Optional(Box::new(t)))
            }
            ("_[?_]", None, [_, _]) => {
                let t = match &types[0] {
                    Ty::Map(_, v) => (**v).clone(),
                    Ty::List(t) => (**t).clone(),
                    _ => Ty::Dyn,
                };
                (default, Ty::Optional(Box::new(t)))
            }
            ("optional.of" | "optional.ofNonZeroValue", None, [_]) => {
                (default, Ty::Optional(Box::new(types[0].clone())))
            }
            ("optional.none", None, []) => (default, Ty::Optional(Box::new(Ty::Dyn))),
            ("hasValue", Some(_), []) => (default, Ty::Bool),
            ("value", Some(_), []) => (default, inner(target_ty.as_ref())),
            ("orValue", Some(_), [_]) => {
                let t = inner(target_ty.as_ref());
                let t = if t == types[0] { t } else { Ty::Dyn };
                (default, t)
            }
            ("or", Some(_), [_]) => (default, target_ty.clone().unwrap_or(Ty::Dyn)),
            // The optional library's list functions.
            ("first" | "last", Some(_), []) => {
                let elem = target_ty.as_ref().map_or(Ty::Dyn, Ty::elem);
                (default, Ty::Optional(Box::new(elem)))
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: None,
        })
    }

    /// DRA's `includes` and the sets extension.
    fn set_functions(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            ..
        } = *call;
        let one = Est::fixed(1);
        let (cost, ty) = match (name, target, args) {
            // DRA's `includes`: Kubernetes' estimator bounds its target by the
            // values a list attribute may have, whatever the target is.
            ("includes", Some(_), [_]) => (
                Est {
                    min: 0,
                    max: super::library::MAX_ATTRIBUTE_VALUES as u64,
                }
                .add(arg_sum),
                Ty::Bool,
            ),
            // The sets extension: the product of the lists' sizes.
            ("sets.contains" | "sets.intersects" | "sets.equivalent", None, [a, b]) => {
                let factor = if name == "sets.equivalent" { 2.0 } else { 1.0 };
                let product = self.size_or_unknown(a).mul(self.size_or_unknown(b));
                (product.factor(factor).add(one).add(arg_sum), Ty::Bool)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: None,
        })
    }

    /// The list extensions that build a list: `lists.range`, `slice`,
    /// `reverse`, `flatten`, `distinct`, `sort` and `sortBy`.
    fn allocating_list_functions(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            ref target_ty,
            ..
        } = *call;
        let result_size;
        let (cost, ty) = match (name, target, args) {
            // The list extensions: allocating calls, their output's size.
            ("lists.range", None, [n]) => {
                let size = Est::fixed(int_literal(n, u64::MAX));
                result_size = Some(size);
                (
                    allocating(1.0, size).add(arg_sum),
                    Ty::List(Box::new(Ty::Int)),
                )
            }
            ("slice", Some(t), [from, to]) => {
                let size = self.size_or_unknown(t);
                let (from, to) = (int_literal(from, 0), int_literal(to, size.max));
                let size = Est::fixed(to.wrapping_sub(from));
                result_size = Some(size);
                (
                    allocating(1.0, size).add(arg_sum),
                    target_ty.clone().unwrap_or(Ty::Dyn),
                )
            }
            ("reverse", Some(t), []) => {
                let size = self.size_or_unknown(t);
                result_size = Some(size);
                (
                    allocating(1.0, size).add(arg_sum),
                    target_ty.clone().unwrap_or(Ty::Dyn),
                )
            }
            ("flatten", Some(t), rest) if rest.len() <= 1 => {
                let depth = rest.first().map_or(1, |d| int_literal(d, u64::MAX));
                let size = self.size_or_unknown(t);
                result_size = Some(size);
                (
                    allocating(depth as f64, size).add(arg_sum),
                    Ty::List(Box::new(Ty::Dyn)),
                )
            }
            ("distinct" | "sort" | "@sortByAssociatedKeys", Some(t), rest) if rest.len() <= 1 => {
                // sortBy sorts by its keys: they are what is counted.
                let (sized, listed) = match rest.first() {
                    Some(keys) if name == "@sortByAssociatedKeys" => (keys, self.ty(keys)),
                    _ => (t, target_ty.clone().unwrap_or(Ty::Dyn)),
                };
                let size = self.size_or_unknown(sized);
                let squared = size.mul(size);
                result_size = Some(squared);
                let elem = listed.elem();
                let cost = if name == "distinct" {
                    allocating(2.0, squared)
                } else {
                    // One overload per element type; strings cost more.
                    let strings = allocating(2.0 + STRING_TRAVERSAL, squared);
                    let others = allocating(2.0, squared);
                    match elem {
                        Ty::String | Ty::Bytes => strings,
                        Ty::Dyn | Ty::Any => strings.union(others),
                        _ => others,
                    }
                };
                (cost.add(arg_sum), target_ty.clone().unwrap_or(Ty::Dyn))
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: result_size,
        })
    }

    /// Kubernetes' list library (and `indexOf` on lists).
    fn list_traversals(&mut self, call: &Call<'_>) -> Option<Rule> {
        let Call {
            name,
            target,
            args,
            arg_sum,
            ref types,
            ref target_ty,
            ..
        } = *call;
        let one = Est::fixed(1);
        let (cost, ty) = match (name, target, args) {
            // Kubernetes' list library (and indexOf on lists): one traversal.
            ("isSorted" | "sum" | "min" | "max" | "indexOf" | "lastIndexOf", Some(t), _) => {
                let size = self.size_or_unknown(t);
                let list_ty = target_ty.clone().unwrap_or(Ty::Dyn);
                let cost = match &list_ty {
                    Ty::List(elem) => {
                        let mut el = one;
                        if matches!(**elem, Ty::String | Ty::Bytes) {
                            el = el.add(self.items_size(t).factor(STRING_TRAVERSAL));
                        }
                        size.mul(el)
                    }
                    _ => size.factor(STRING_TRAVERSAL),
                };
                if let (Ty::List(elem), "indexOf" | "lastIndexOf", [wanted]) =
                    (&list_ty, name, types.as_slice())
                    && elem.is_known()
                    && wanted.is_known()
                    && **elem != *wanted
                    && self.type_error.is_none()
                {
                    self.type_error = Some(format!(
                        "found no matching overload for '{name}' applied to '{}.({})'",
                        list_ty.name(),
                        wanted.name()
                    ));
                }
                let t = match name {
                    "isSorted" => Ty::Bool,
                    "indexOf" | "lastIndexOf" => Ty::Int,
                    _ => list_ty.elem(),
                };
                (cost.add(arg_sum), t)
            }
            _ => return None,
        };
        Some(Rule {
            cost,
            ty,
            size: None,
        })
    }

    /// cel-go's rule for `==`, `!=` and string / bytes ordering: the shorter
    /// side's length at 0.1 a character.
    fn compare_strings(&mut self, a: &IdedExpr, b: &IdedExpr) -> Est {
        let (l, r) = (self.size_or_unknown(a), self.size_or_unknown(b));
        let smallest = l.max.min(r.max);
        Est {
            min: u64::from(smallest > 0),
            max: smallest,
        }
        .factor(STRING_TRAVERSAL)
    }
}

/// The value an optional holds.
fn inner(t: Option<&Ty>) -> Ty {
    match t {
        Some(Ty::Optional(t)) => (**t).clone(),
        _ => Ty::Dyn,
    }
}

/// An int literal's value (0 when negative), or `default`.
fn int_literal(e: &IdedExpr, default: u64) -> u64 {
    match &e.expr {
        Expr::Literal(LiteralValue::Int(n)) => u64::try_from(*n.inner()).unwrap_or(0),
        _ => default,
    }
}

/// cel-go's estimate of a list extension call that builds a list of `size`.
fn allocating(factor: f64, size: Est) -> Est {
    size.factor(factor)
        .add(Est::fixed(1))
        .add(Est::fixed(LIST_CREATE))
}

/// Kubernetes' estimate of `replace`'s result size.
fn replaced_size(size: Est, from: Est, to: Est) -> Est {
    let (mut count, mut retained) = (Est::fixed(0), Est::fixed(0));
    if from.min == 0 {
        count.max = if size.max < u64::MAX {
            size.max + 1
        } else {
            size.max
        };
        retained.max = size.max;
    } else if to.max <= from.min {
        count.max = 0;
        retained.max = size.max;
    } else {
        count.max = (size.max as f64 / from.min as f64).ceil() as u64;
    }
    if from.max == 0 {
        count.min = if size.min < u64::MAX {
            size.min + 1
        } else {
            size.min
        };
        retained.min = size.min;
    } else if from.max <= to.min {
        count.min = 0;
        retained.min = size.min;
    } else {
        count.min = (size.min as f64 / from.max as f64).ceil() as u64;
    }
    count.mul(to).add(retained)
}
