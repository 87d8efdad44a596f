//! Evaluating a selector: the `device` variable, the fast path or the interpreter, runtime errors.

use std::collections::{BTreeSet, HashMap};

use cel::{ExecutionError, Value};

use super::values::{QuantityValue, Semver, quantity_value};
use super::{
    Compiler, Device, EvalError, PreparedDevice, Selector, SelectorError, attribute_value,
};

impl Compiler {
    /// Evaluates `selector` against `device`.
    pub fn matches(&self, selector: &Selector, device: &Device) -> Result<bool, EvalError> {
        // Kubernetes makes every attribute a value first: one it cannot
        // fails the selector whatever the selector reads (the interpreter's
        // device value says so by itself; the fast path must ask).
        if selector.fast.is_some()
            && let Some(err) = device.attribute_error()
        {
            return Err(err);
        }
        self.matches_checked(selector, device)
    }

    /// [`Self::matches`] on a device known to have no
    /// [`Device::attribute_error`] (the allocator checks each device once).
    pub(crate) fn matches_checked(
        &self,
        selector: &Selector,
        device: &Device,
    ) -> Result<bool, EvalError> {
        match &selector.fast {
            Some(fast) => fast.eval(device).map_err(EvalError),
            None => self.matches_prepared(selector, &self.prepare(device)?),
        }
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
        // A prepared device has every attribute as a value (see `prepare`).
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

/// The error as Kubernetes words it, naming the types of the values
/// involved and never printing the values: a map's fields come in hash
/// order, and an error that says them would differ from run to run (the
/// allocator's answer must be the same every time).
fn kubernetes_wording(err: &ExecutionError) -> String {
    match err {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        ExecutionError::UnsupportedBinaryOperator(op, left, right) => format!(
            "no such overload: {} {op} {}",
            type_name(left),
            type_name(right)
        ),
        ExecutionError::ValuesNotComparable(left, right) => format!(
            "no such overload: {} can not be compared to {}",
            type_name(left),
            type_name(right)
        ),
        ExecutionError::UnsupportedIndex(index, target) => format!(
            "no such overload: a {} cannot index a {}",
            type_name(index),
            type_name(target)
        ),
        ExecutionError::UnsupportedKeyType(key) => {
            format!("unsupported key type: {}", type_name(key))
        }
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
        let value = attribute_value(name, attribute)?;
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
