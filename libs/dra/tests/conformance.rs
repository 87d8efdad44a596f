//! Kubernetes' own DRA test tables, run through Switchyard: the table every
//! variant of the structured allocator is tested with
//! (`structured/internal/allocatortesting` of
//! k8s.io/dynamic-resource-allocation v0.36.3: `TestAllocator` and
//! `TestLexicographicalAllocator`) and the CEL table (`cel/compile_test.go`).
//!
//! `tools/dra-conformance` extracts them (see its main.go): each case's inputs,
//! the features or settings the table runs it with, whether the table's own
//! checks held, and what Kubernetes answers for the same inputs with 1.36's
//! defaults. Switchyard implements those defaults only, so that answer is the
//! one it must give: the same devices for the same requests (or the same
//! kind of failure) for the allocator; the same result or kind of error, the
//! same words for an evaluation error and the same worst-case cost for CEL.
//!
//! The table runs each case with the features it is about; one about a
//! feature turned off (DRADeviceTaints, say) or on where 1.36 has it off
//! (DRAListTypeAttributes) is compared on what 1.36 answers for the same
//! inputs — a question about 1.36 all the same. Where the table's settings
//! are 1.36's scheduler's, Switchyard must also meet the table's own
//! expectations. Skipped, counted by reason, are only what Switchyard does
//! not model and what the extraction cannot read; every count is asserted,
//! so a new skip — or a case gone — fails the test.

#[allow(dead_code)] // the seeded generator serves the generated tests
mod support;
use support::normalize;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use switchyard_dra::Quantity;
use switchyard_dra::alloc::{AllocatedState, Allocator, DeviceId, Outcome, outcome};
use switchyard_dra::cel::{Attribute, Compiler, Device, SelectorError};
use switchyard_dra::input::strict;

/// The records `dra-conformance MODE` prints, one JSON object a line.
fn extract(mode: &str) -> Vec<Value> {
    support::run_oracle_with("dra-conformance", &[mode], String::new())
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// An object as Switchyard reads one from a file: every field known.
fn read<T: DeserializeOwned>(case: &str, v: &Value) -> T {
    strict(v.clone()).unwrap_or_else(|e| panic!("{case}: Switchyard cannot read {v}: {e}"))
}

fn list<T: DeserializeOwned>(case: &str, v: &Value) -> Vec<T> {
    v.as_array()
        .map(|items| items.iter().map(|item| read(case, item)).collect())
        .unwrap_or_default()
}

fn device_id(r: &Value) -> DeviceId {
    let s = |k: &str| -> Arc<str> { r[k].as_str().unwrap_or_default().into() };
    DeviceId {
        driver: s("driver"),
        pool: s("pool"),
        device: s("device"),
    }
}

/// The AllocatedState a case starts from, as the harness gives it.
fn allocated_state(v: &Value) -> AllocatedState {
    let refs = |k: &str| v[k].as_array().cloned().unwrap_or_default();
    let mut state = AllocatedState::default();
    for r in refs("devices") {
        state.devices.insert(device_id(&r));
    }
    for r in refs("shared") {
        let share = r["shareID"].as_str().unwrap_or_default().to_string();
        state.shared.insert((device_id(&r), share));
    }
    for r in refs("capacity") {
        let consumed = r["consumed"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, q)| (name.clone(), Quantity::parse(q.as_str().unwrap()).unwrap()))
            .collect::<BTreeMap<_, _>>();
        state.capacity.insert(device_id(&r), consumed);
    }
    state
}

/// Why an allocator case is not compared, if it is not.
fn allocator_skip(case: &Value) -> Option<&'static str> {
    if case["interrupted"] == json!(true) {
        return Some("a cancelled context (Switchyard's allocator takes none: it runs to the end)");
    }
    None
}

/// Switchyard's answer for an allocator case.
fn switchyard_allocates(name: &str, case: &Value, compiler: &Arc<Compiler>) -> Outcome {
    let classes: Vec<DeviceClass> = list(name, &case["classes"]);
    let slices: Vec<ResourceSlice> = list(name, &case["slices"]);
    let claims: Vec<ResourceClaim> = list(name, &case["claims"]);
    let node: Node = read(name, &case["node"]);
    match Allocator::new(
        allocated_state(&case["allocated"]),
        &classes,
        &slices,
        compiler.clone(),
    ) {
        Ok(allocator) => outcome(&allocator, &node, &claims.iter().collect::<Vec<_>>()),
        Err(e) => Outcome {
            node: node.metadata.name.unwrap_or_default(),
            result: "error".into(),
            allocations: Vec::new(),
            error: Some(e.to_string()),
        },
    }
}

#[test]
fn the_allocator_table_of_kubernetes() {
    let cases = extract("allocator");
    let compiler = Arc::new(Compiler::default());
    let mut skipped = BTreeMap::<&str, usize>::new();
    let mut by_result = BTreeMap::<String, usize>::new();
    let mut differ = Vec::new();
    let mut worded_differently = Vec::new();
    let (mut run, mut feature_sensitive, mut list_type_attributes) = (0, 0, 0);
    let mut names = HashSet::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        assert!(names.insert(name), "{name}: recorded twice");
        // The extraction is faithful only if the table's own checks held.
        assert_eq!(
            case["tablePassed"],
            json!(true),
            "{name}: the table's checks failed on Kubernetes' allocator (dra-conformance allocator prints why on stderr)"
        );
        if let Some(reason) = allocator_skip(case) {
            *skipped.entry(reason).or_default() += 1;
            continue;
        }
        run += 1;
        if case["features"]["ListTypeAttributes"] == json!(true) {
            list_type_attributes += 1;
        }
        // Where 1.36's features give another answer than the table's, the
        // case is about a feature's being off (or on, for list attributes).
        if normalize(&case["table"]) != normalize(&case["kubernetes"]) {
            feature_sensitive += 1;
        }
        let theirs: Outcome = serde_json::from_value(case["kubernetes"].clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = switchyard_allocates(name, case, &compiler);
        *by_result.entry(theirs.result.clone()).or_default() += 1;
        let same = ours.result == theirs.result
            && normalize(&serde_json::to_value(&ours.allocations).unwrap())
                == normalize(&serde_json::to_value(&theirs.allocations).unwrap());
        if !same {
            differ.push(format!(
                "{name}:\n  kubernetes: {}\n  switchyard: {}",
                serde_json::to_string(&theirs).unwrap(),
                serde_json::to_string(&ours).unwrap()
            ));
        } else if ours.error != theirs.error {
            worded_differently.push(format!(
                "{name}:\n  kubernetes: {:?}\n  switchyard: {:?}",
                theirs.error, ours.error
            ));
        }
    }
    eprintln!(
        "allocator table: {} cases; {run} compared ({list_type_attributes} run by the table with \
         DRAListTypeAttributes on; {feature_sensitive} answered otherwise with 1.36's features than \
         with the table's); Kubernetes' answers: {by_result:?}; skipped: {skipped:?}; {} failures \
         worded differently",
        cases.len(),
        worded_differently.len()
    );
    for w in &worded_differently {
        eprintln!("{w}");
    }
    assert!(
        differ.is_empty(),
        "{} of {run} cases differ:\n{}",
        differ.len(),
        differ.join("\n")
    );
    assert_eq!(cases.len(), 229, "cases in the table");
    assert_eq!(run, 226, "cases compared");
    assert_eq!(
        list_type_attributes, 21,
        "cases about list-typed attributes"
    );
    assert_eq!(
        feature_sensitive, 27,
        "cases answered otherwise with 1.36's features"
    );
    // The same failure in other words: a CEL compile error without cel-go's
    // position and caret lines (3), and a missing class in the scheduler's
    // words where the table's lister has its own (2).
    assert_eq!(worded_differently.len(), 5, "failures worded differently");
    assert_eq!(
        skipped,
        BTreeMap::from([(
            "a cancelled context (Switchyard's allocator takes none: it runs to the end)",
            3
        )]),
        "cases skipped, by reason"
    );
}

/// A device of the CEL table as Switchyard's selectors see it: a list
/// attribute (or one without a value) is [`Attribute::Unsupported`].
fn cel_device(v: &Value) -> Device {
    let attributes = v["attributes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, a)| {
            let value = match a.as_object().map(|o| o.iter().next()) {
                Some(Some((k, x))) if a.as_object().unwrap().len() == 1 => match k.as_str() {
                    "int" => Attribute::Int(x.as_i64().unwrap()),
                    "bool" => Attribute::Bool(x.as_bool().unwrap()),
                    "string" => Attribute::String(x.as_str().unwrap().into()),
                    "version" => Attribute::Version(x.as_str().unwrap().into()),
                    _ => Attribute::Unsupported,
                },
                _ => Attribute::Unsupported,
            };
            (name.clone(), value)
        })
        .collect();
    let capacity = v["capacity"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, q)| (name.clone(), Quantity::parse(q.as_str().unwrap()).unwrap()))
        .collect();
    Device {
        driver: v["driver"].as_str().unwrap_or_default().into(),
        allow_multiple_allocations: v["allowMultipleAllocations"].as_bool().unwrap_or(false),
        attributes,
        capacity,
    }
}

/// Kubernetes' answer as a kind: the result, a compile error or an
/// evaluation error. A worst-case cost over the limit is a compile error:
/// the API server refuses the selector before a scheduler sees it.
fn kind_of_theirs(v: &Value) -> String {
    if v["maxCost"].as_u64().is_some_and(|c| c > 1_000_000) {
        return "compile error".into();
    }
    if let Some(b) = v.get("result") {
        return format!("result {b}");
    }
    if v.get("compileError").is_some() {
        return "compile error".into();
    }
    "error".into()
}

fn kind_of_ours(r: &Result<bool, SelectorError>) -> String {
    match r {
        Ok(b) => format!("result {b}"),
        Err(SelectorError::Compile(_)) => "compile error".into(),
        Err(SelectorError::Eval(_)) => "error".into(),
    }
}

/// Why a CEL case is not compared, if it is not.
fn cel_skip(case: &Value, names: &HashSet<&str>) -> Option<&'static str> {
    if case.get("unreadable").is_some() {
        return Some("built by Go code, not literals (dra-conformance reads literals only)");
    }
    // A case that names no setting of DRAListTypeAttributes runs with both:
    // the same inputs, and the same answer from 1.36.
    let name = case["name"].as_str().unwrap_or_default();
    if let Some(base) = name.strip_suffix("-list-type-attributes-true")
        && names.contains(format!("{base}-list-type-attributes-false").as_str())
    {
        return Some("the inputs of its run with DRAListTypeAttributes off, compared there");
    }
    None
}

/// How Switchyard's answer misses the table's own expectations (as TestCEL
/// checks them: the words an error must contain, else the match), if it does.
fn misses_expectations(case: &Value, ours: &Result<bool, SelectorError>) -> Option<String> {
    let expect = |k: &str| case[k].as_str().filter(|s| !s.is_empty());
    let (compile, eval) = (expect("expectCompileError"), expect("expectMatchError"));
    match ours {
        Err(SelectorError::Compile(e)) if compile.is_some_and(|w| e.to_string().contains(w)) => {
            None
        }
        Err(SelectorError::Eval(e)) if eval.is_some_and(|w| e.to_string().contains(w)) => None,
        Ok(b) if compile.is_none() && eval.is_none() && case["expectMatch"] == json!(b) => None,
        _ => Some(format!(
            "expected compile error {compile:?}, evaluation error {eval:?}, else {}; got {ours:?}",
            case["expectMatch"]
        )),
    }
}

#[test]
fn the_cel_table_of_kubernetes() {
    let cases = extract("cel");
    let compiler = Compiler::default();
    let mut skipped = BTreeMap::<&str, usize>::new();
    let mut differ = Vec::new();
    let (mut run, mut against_the_table, mut list_type_attributes) = (0, 0, 0);
    let mut names = HashSet::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        assert!(names.insert(name), "{name}: recorded twice");
    }
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        // A case was read right only if Kubernetes, with the table's
        // settings, meets the table's expectations on it.
        if case.get("unreadable").is_none() {
            assert_eq!(
                case["tableHolds"],
                json!(true),
                "{name}: {}",
                case["tableFailure"]
            );
        }
        if let Some(reason) = cel_skip(case, &names) {
            *skipped.entry(reason).or_default() += 1;
            continue;
        }
        run += 1;
        if case["listTypeAttributes"] == json!(true) {
            list_type_attributes += 1;
        }
        let expr = case["expression"].as_str().unwrap();
        let theirs = &case["kubernetes"];
        let ours = compiler.eval(expr, &cel_device(&case["device"]));
        let (a, b) = (kind_of_theirs(theirs), kind_of_ours(&ours));
        if a != b {
            differ.push(format!(
                "{name}: {expr}\n  kubernetes: {theirs}\n  switchyard: {ours:?}"
            ));
        }
        // Evaluation errors in Kubernetes' words.
        if let (Some(words), Err(SelectorError::Eval(e))) = (theirs["error"].as_str(), &ours)
            && e.to_string() != words
        {
            differ.push(format!(
                "{name}: {expr}\n  kubernetes' error: {words}\n  switchyard's: {e}"
            ));
        }
        // The worst-case cost is the API server's, wherever it compiles.
        if let (Some(cost), Ok(selector)) =
            (theirs["maxCost"].as_u64(), compiler.compile(expr).as_ref())
            && selector.max_cost() != Some(cost)
        {
            differ.push(format!(
                "{name}: {expr}\n  kubernetes' worst-case cost: {cost}\n  switchyard's: {:?}",
                selector.max_cost()
            ));
        }
        // Where the table's settings are the scheduler's (the environment of
        // stored selectors), Switchyard meets the table's own expectations
        // too. (NewExpressions is the API server's environment for new
        // selectors, which declares less.)
        if case["envType"] == json!("StoredExpressions")
            && case["listTypeAttributes"] == json!(false)
        {
            against_the_table += 1;
            if let Some(miss) = misses_expectations(case, &ours) {
                differ.push(format!("{name}: {expr}\n  the table: {miss}"));
            }
        }
    }
    eprintln!(
        "CEL table: {} runs of its cases; {run} compared ({list_type_attributes} run by the table \
         with DRAListTypeAttributes on; {against_the_table} against the table's own expectations \
         too); skipped: {skipped:?}",
        cases.len()
    );
    assert!(
        differ.is_empty(),
        "{} differences in {run} cases:\n{}",
        differ.len(),
        differ.join("\n")
    );
    assert_eq!(cases.len(), 105, "runs of the table's cases");
    assert_eq!(run, 66, "cases compared");
    assert_eq!(
        list_type_attributes, 28,
        "cases about list-typed attributes"
    );
    assert_eq!(
        against_the_table, 34,
        "cases compared against the table's expectations"
    );
    assert_eq!(
        skipped,
        BTreeMap::from([
            (
                "built by Go code, not literals (dra-conformance reads literals only)",
                3
            ),
            (
                "the inputs of its run with DRAListTypeAttributes off, compared there",
                36
            ),
        ]),
        "cases skipped, by reason"
    );
}

/// `includes`, which the CEL table showed Switchyard refusing as undeclared:
/// Kubernetes 1.36's scheduler compiles stored selectors with every function
/// of the release declared, DRAListTypeAttributes' `includes` among them, so
/// it evaluates one that calls it. Case by case against `cel-oracle` (the
/// scheduler's compiler): the result or kind of error, its words, the cost.
#[test]
fn includes_is_evaluated_as_the_scheduler_evaluates_stored_selectors() {
    let long_list = format!(
        "[{}]",
        (1..=49)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cases = [
        "device.attributes['dra.example.com'].model.includes('a100')".to_string(),
        "device.attributes['dra.example.com'].model.includes('h100')".into(),
        "device.attributes['dra.example.com'].index.includes(3)".into(),
        "device.attributes['dra.example.com'].index.includes(3.0)".into(),
        "device.attributes['dra.example.com'].index.includes('3')".into(),
        "device.attributes['dra.example.com'].mig.includes(true)".into(),
        "device.attributes['dra.example.com'].driverVersion.includes(semver('550.54.15'))".into(),
        "device.attributes['dra.example.com'].driverVersion.includes(semver('550.54.16'))".into(),
        "device.capacity['dra.example.com'].memory.includes(quantity('40Gi'))".into(),
        "device.capacity['dra.example.com'].memory.includes(quantity('42949672960'))".into(),
        "device.attributes['dra.example.com'].missing.includes(1)".into(),
        "[1, 2].includes(2)".into(),
        "[1, 2].includes(3)".into(),
        "['a', 'b'].includes(device.attributes['dra.example.com'].model)".into(),
        "{'a': 1}.includes('a')".into(),
        "'abc'.includes('a')".into(),
        format!("{long_list}.includes(48)"),
        format!("{long_list}.includes(49)"),
    ];
    let device = json!({
        "driver": "dra.example.com",
        "attributes": {
            "model": {"string": "a100"},
            "index": {"int": 3},
            "mig": {"bool": true},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {"memory": "40Gi"},
    });
    let input: String = cases
        .iter()
        .map(|e| format!("{}\n", json!({"expr": e, "device": device})))
        .collect();
    let answers: Vec<Value> = support::run_oracle("cel-oracle", input)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), cases.len());
    let compiler = Compiler::default();
    let ours_device = cel_device(&device);
    for (expr, theirs) in cases.iter().zip(&answers) {
        let ours = compiler.eval(expr, &ours_device);
        assert_eq!(
            kind_of_ours(&ours),
            kind_of_theirs(theirs),
            "{expr}: kubernetes {theirs}, switchyard {ours:?}"
        );
        if let (Some(words), Err(SelectorError::Eval(e))) = (theirs["error"].as_str(), &ours) {
            assert_eq!(e.to_string(), words, "{expr}");
        }
        let compiled = compiler.compile(expr);
        let selector = compiled.as_ref().as_ref().expect("compiles");
        assert_eq!(
            selector.max_cost(),
            theirs["maxCost"].as_u64(),
            "{expr}: worst-case cost"
        );
    }
    // Both outcomes and the length limit are exercised.
    let kinds: Vec<String> = answers.iter().map(kind_of_theirs).collect();
    for kind in ["result true", "result false", "error"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} among {kinds:?}");
    }
}

/// A comprehension over what is not a list, a map or `dyn` (an attribute's
/// value, typed `any`; a quantity; a string...), which the CEL table's
/// list-attribute cases showed Switchyard accepting and failing only when
/// evaluated: Kubernetes' type checker refuses it when the selector is
/// compiled — so it fails even where no device is evaluated. And `dyn(x)`
/// ranged over, which Switchyard refused as of unbounded cost where
/// Kubernetes carries `x`'s size over. Case by case against `cel-oracle`:
/// the kind of answer, the check's words, the worst-case cost.
#[test]
fn a_comprehension_over_a_scalar_is_refused_when_compiled() {
    let refused = [
        (
            "device.attributes['dra.example.com'].model.exists(x, true)",
            "any",
        ),
        (
            "device.attributes['dra.example.com'].index.all(x, x > 0)",
            "any",
        ),
        (
            "cel.bind(v, device.attributes['dra.example.com'].index, v.exists(x, true))",
            "any",
        ),
        (
            "device.capacity['dra.example.com'].memory.exists(x, true)",
            "kubernetes.Quantity",
        ),
        ("device.driver.exists(x, true)", "string"),
        ("device.allowMultipleAllocations.all(x, true)", "bool"),
        ("device.exists(x, true)", "kubernetes.DRADevice"),
        ("'abc'.map(x, x).size() == 0", "string"),
        ("2u.filter(x, true).size() == 0", "uint"),
        ("1.5.exists_one(x, true)", "double"),
        ("null.exists(x, true)", "null"),
        ("semver('1.0.0').exists(x, true)", "kubernetes.Semver"),
        ("[1].map(x, x).exists(y, y.exists(z, true))", "int"),
    ];
    // Lists, maps and `dyn` are ranged over (`dyn` fails when evaluated).
    let ranged = [
        "device.attributes['dra.example.com'].exists(x, true)",
        "device.attributes.all(d, device.attributes[d].size() < 40)",
        "[1, 2].exists(x, x == 2)",
        "{'a': 1}.exists(k, k == 'a')",
        "dyn([1, 2]).exists(x, x == 2)",
        "dyn(1).exists(x, true)",
        "dyn('abc').exists(x, true)",
        "dyn(device.attributes['dra.example.com'].index).exists(x, true)",
    ];
    let device = json!({
        "driver": "dra.example.com",
        "attributes": {"model": {"string": "a100"}, "index": {"int": 3}},
        "capacity": {"memory": "40Gi"},
    });
    let exprs: Vec<&str> = refused.iter().map(|(e, _)| *e).chain(ranged).collect();
    let input: String = exprs
        .iter()
        .map(|e| format!("{}\n", json!({"expr": e, "device": device})))
        .collect();
    let answers: Vec<Value> = support::run_oracle("cel-oracle", input)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), exprs.len());
    let compiler = Compiler::default();
    let ours_device = cel_device(&device);
    for (i, (expr, theirs)) in exprs.iter().zip(&answers).enumerate() {
        let ours = compiler.eval(expr, &ours_device);
        assert_eq!(
            kind_of_ours(&ours),
            kind_of_theirs(theirs),
            "{expr}: kubernetes {theirs}, switchyard {ours:?}"
        );
        if let Some((_, ty)) = refused.get(i) {
            let words = format!(
                "expression of type '{ty}' cannot be range of a comprehension (must be list, map, or dynamic)"
            );
            assert!(
                theirs["compileError"].as_str().unwrap().contains(&words),
                "{expr}: {theirs}"
            );
            let Err(SelectorError::Compile(e)) = &ours else {
                panic!("{expr}: compiled: {ours:?}");
            };
            assert_eq!(
                e.to_string(),
                format!("compilation failed: {words}"),
                "{expr}"
            );
        } else {
            // `dyn(x)` passes the type check; its worst-case cost is `x`'s
            // size times the loop's (cel-go unwraps `dyn` when estimating).
            let compiled = compiler.compile(expr);
            let selector = compiled.as_ref().as_ref().expect("compiles");
            assert_eq!(selector.max_cost(), theirs["maxCost"].as_u64(), "{expr}");
        }
    }
}
