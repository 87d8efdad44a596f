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
//!   server estimates it (`cost`). Compiled selectors are cached by
//!   their text.
//!
//! `cel.bind` is the bindings macro; optional types (`a.?b`, `m[?k]`,
//! `optional.of/none/ofNonZeroValue`, `hasValue`, `value`, `orValue`, `or`)
//! are the crate's; list `indexOf` / `lastIndexOf` (Kubernetes' lists
//! library), `first` / `last` (the optional library), `dyn` and
//! `strings.quote` too, and DRA's `includes` (declared for stored selectors
//! in 1.36 although new ones may use it only with DRAListTypeAttributes on).
//! The type checker's refusals that follow from the types known here: a list
//! or map literal mixing element types (`expected type 'int' but found
//! 'string'`), `indexOf` of a value of another type than the list's, and a
//! comprehension over a value that is not a list, a map or `dyn` (an
//! attribute's, a quantity, a string). Not yet, and refused as such: the URL, IP,
//! CIDR, format, duration, timestamp and bytes libraries and two-variable
//! comprehensions. One known difference: when both sides of `&&` or `||`
//! fail, Kubernetes reports the left side's error and this evaluator the right
//! side's (the result — an error — is the same).

mod compile;
mod cost;
mod eval;
mod fast;
mod library;
mod values;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use cel::{Context, Env, Program, Value, extensions};

use crate::quantity::Quantity;

use fast::Fast;
use library::{bind_macro, list_library};
use values::register;

pub use values::Semver;

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
    /// No single value: a list (list-typed attributes are an alpha feature,
    /// off in Kubernetes 1.36) or nothing at all. As in Kubernetes, every
    /// selector evaluated on such a device fails at runtime ("unsupported
    /// attribute value"), which aborts the allocation until the slice is
    /// fixed — better than allocating as if the attribute were not there.
    Unsupported,
}

impl Device {
    /// Why the device's attributes cannot all be given to a selector, as
    /// Kubernetes words it: any selector evaluated on it fails with this.
    pub fn attribute_error(&self) -> Option<EvalError> {
        self.attributes
            .iter()
            .find_map(|(name, attribute)| attribute_value(name, attribute).err())
    }
}

/// An attribute as its CEL value, or why it has none.
pub(crate) fn attribute_value(name: &str, attribute: &Attribute) -> Result<Value, EvalError> {
    Ok(match attribute {
        Attribute::Int(v) => Value::Int(*v),
        Attribute::Bool(v) => Value::Bool(*v),
        Attribute::String(v) => Value::from(v.as_str()),
        Attribute::Version(v) => Value::Opaque(Arc::new(Semver::parse(v).ok_or_else(|| {
            EvalError(format!(
                "attribute {name}: parse semantic version: {v:?} is not a semantic version"
            ))
        })?)),
        Attribute::Unsupported => {
            return Err(EvalError(format!(
                "attribute {name}: unsupported attribute value"
            )));
        }
    })
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
        cost::MAX_COST
    )]
    TooComplex { cost: u64 },
}

/// A runtime error, worded as Kubernetes words it where it matters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

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

    /// The attribute and capacity names the selector looks up, each as
    /// `domain/name` and as the bare `name` (how a device of the domain's
    /// driver may publish it), when it is evaluated by the fast path; `None`
    /// when it may read anything. Besides these it reads only the driver: a
    /// device's other attributes and capacities cannot change its outcome.
    pub fn reads(&self) -> Option<BTreeSet<String>> {
        let mut names = BTreeSet::new();
        self.fast.as_ref()?.reads(&mut names);
        Some(names)
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
        library::register_lists_sets_regex(&mut root);
        Compiler {
            env,
            root,
            cache: Mutex::default(),
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
