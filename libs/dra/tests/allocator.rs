//! The allocator against the real one: generated cases (slices, classes,
//! claims, existing allocations) run through `alloc-oracle`, the Kubernetes
//! structured allocator (k8s.io/dynamic-resource-allocation v0.36.3, the
//! 1.36 default feature set), and through ours; the decisions must be the
//! same — the same devices for the same requests, or the same class of
//! failure.
//!
//! SWITCHYARD_ALLOC_CASES (default 3000) and SWITCHYARD_ALLOC_SEED (default 1)
//! choose the cases.

mod support;
use support::normalize;

use std::sync::Arc;

use serde_json::{Value, json};
use support::Random;
use switchyard_dra::alloc::{Objects, Outcome};
use switchyard_dra::cel::Compiler;

struct Gen(u64);

impl Random for Gen {
    fn state(&mut self) -> &mut u64 {
        &mut self.0
    }
}

impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const GPU: &str = "gpu.deckhouse.io";
const OTHER: &str = "other.example.com";

const SELECTORS: &[&str] = &[
    "true",
    "device.driver == 'gpu.deckhouse.io'",
    "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].type == 'gpu'",
    "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].type == 'mig'",
    "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].model.startsWith('a100')",
    "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].index % 2 == 0",
    "device.driver == 'gpu.deckhouse.io' && device.capacity['gpu.deckhouse.io'].memory.compareTo(quantity('20Gi')) >= 0",
    "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].driverVersion.isGreaterThan(semver('550.0.0'))",
    "device.driver == 'other.example.com'",
    "device.allowMultipleAllocations",
    "!device.allowMultipleAllocations",
    "'kind' in device.attributes['other.example.com']",
];

/// Selectors that fail at run time on some devices.
const FAILING: &[&str] = &[
    "device.attributes['gpu.deckhouse.io'].missing == 1",
    "device.attributes['gpu.deckhouse.io'].type == 'gpu'",
];

struct Built {
    objects: Vec<Value>,
    /// (driver, pool, device, shareable) of every device published.
    devices: Vec<(String, String, String, bool)>,
}

fn quantity(g: &mut Gen) -> &'static str {
    g.pick(&["5Gi", "10Gi", "20Gi", "40Gi", "80Gi"])
}

fn device(
    g: &mut Gen,
    b: &mut Built,
    driver: &str,
    pool: &str,
    name: String,
    counters: Option<&str>,
    per_device: bool,
) -> Value {
    let mut d = json!({"name": name});
    let shareable = g.chance(15);
    if driver == GPU {
        let mut attributes = json!({
            "type": {"string": g.pick(&["gpu", "mig"])},
            "gpu.deckhouse.io/model": {"string": g.pick(&["a100-40gb", "a100-80gb", "h100-80gb"])},
            "index": {"int": g.below(8)},
            "driverVersion": {"version": g.pick(&["535.1.0", "550.54.15", "560.0.1"])},
        });
        if g.chance(30) {
            attributes["zone"] = json!({"string": g.pick(&["a", "b"])});
        }
        if g.chance(1) {
            // A list-typed attribute, which Kubernetes 1.36 does not read:
            // any selector on the device fails and the allocation with it.
            attributes["nvlinkPeers"] = json!({"ints": [g.below(8), g.below(8)]});
        }
        d["attributes"] = attributes;
    } else {
        d["attributes"] = json!({"other.example.com/kind": {"string": g.pick(&["nic", "fpga"])}, "index": {"int": g.below(4)}});
    }
    let memory = quantity(g);
    let mut capacity = json!({"memory": {"value": memory}});
    if shareable {
        d["allowMultipleAllocations"] = json!(true);
        let policy = match g.below(4) {
            0 => json!({"default": "5Gi", "validRange": {"min": "5Gi", "step": "5Gi"}}),
            1 => json!({"default": "10Gi", "validValues": ["5Gi", "10Gi", "20Gi"]}),
            2 => json!({"default": "1Gi", "validRange": {"min": "1Gi", "max": "20Gi"}}),
            _ => Value::Null,
        };
        if !policy.is_null() {
            capacity["memory"]["requestPolicy"] = policy;
        }
        if g.chance(50) {
            capacity["cores"] = json!({"value": "8"});
        }
    }
    d["capacity"] = capacity;
    if let Some(set) = counters {
        d["consumesCounters"] = json!([{"counterSet": set, "counters": {"memory": {"value": memory}, "slices": {"value": g.pick(&["1", "2", "3", "7"])}}}]);
    }
    if g.chance(8) {
        d["taints"] = json!([{"key": g.pick(&["broken", "maintenance"]), "value": "yes", "effect": g.pick(&["NoSchedule", "NoExecute"])}]);
    }
    if g.chance(4) {
        d["bindingConditions"] = json!(["attached"]);
        d["bindingFailureConditions"] = json!(["failed"]);
        if g.chance(50) {
            d["bindsToNode"] = json!(true);
        }
    }
    if per_device {
        match g.below(3) {
            0 => d["nodeName"] = json!(g.pick(&["n1", "n2"])),
            1 => d["allNodes"] = json!(true),
            _ => {
                d["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": [g.pick(&["a", "b"])]}]}]})
            }
        }
    }
    b.devices.push((
        driver.into(),
        pool.into(),
        d["name"].as_str().unwrap().into(),
        shareable,
    ));
    d
}

fn slice(
    name: String,
    driver: &str,
    pool: &str,
    generation: u64,
    count: u64,
    placement: &Value,
) -> Value {
    let mut spec = json!({"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}});
    for (k, v) in placement.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec})
}

fn pools(g: &mut Gen, b: &mut Built) {
    let n = 1 + g.below(3);
    for p in 0..n {
        let driver = if g.chance(75) { GPU } else { OTHER };
        let pool = format!("pool-{}", g.pick(&["a", "b", "c"]));
        let pool = if p > 0 && g.chance(20) {
            pool
        } else {
            format!("{pool}{p}")
        };
        let placement = match g.below(6) {
            0..=2 => json!({"nodeName": g.pick(&["n1", "n1", "n2"])}),
            3 => json!({"allNodes": true}),
            4 => {
                json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": g.pick(&["In", "NotIn"]), "values": [g.pick(&["a", "b"])]}]}]}})
            }
            _ => json!({"perDeviceNodeSelection": true}),
        };
        let per_device = placement.get("perDeviceNodeSelection").is_some();
        let partitionable = driver == GPU && g.chance(35);
        let slices = 1 + g.below(2);
        let generation = 1 + g.below(2);
        let count = slices + u64::from(partitionable) + u64::from(g.chance(7));
        let duplicate = g.chance(4);
        if partitionable {
            let counters = json!({"sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": g.pick(&["40Gi", "80Gi"])}, "slices": {"value": "7"}}}]});
            let mut placement = placement.clone();
            // Counter slices name the node like their devices (or all nodes).
            if per_device || placement.get("nodeSelector").is_some() {
                placement = json!({"allNodes": true});
            }
            for (k, v) in counters.as_object().unwrap() {
                placement[k] = v.clone();
            }
            b.objects.push(slice(
                format!("{pool}-counters"),
                driver,
                &pool,
                generation,
                count,
                &placement,
            ));
        }
        for s in 0..slices {
            let mut devices = Vec::new();
            for d in 0..1 + g.below(6) {
                let name = if duplicate && s == 1 && d == 0 {
                    "dev-0-0".to_string()
                } else {
                    format!("dev-{s}-{d}")
                };
                devices.push(device(
                    g,
                    b,
                    driver,
                    &pool,
                    name,
                    partitionable.then_some("gpu-0"),
                    per_device,
                ));
            }
            let mut placement = placement.clone();
            placement["devices"] = Value::Array(devices);
            b.objects.push(slice(
                format!("{pool}-{s}"),
                driver,
                &pool,
                generation,
                count,
                &placement,
            ));
        }
        if g.chance(10) {
            // An older generation still around.
            let mut placement = placement.clone();
            placement["devices"] = json!([{"name": "old-0"}]);
            b.objects.push(slice(
                format!("{pool}-old"),
                driver,
                &pool,
                generation - 1 + u64::from(generation == 1) * 3,
                1,
                &placement,
            ));
        }
    }
}

fn selectors(g: &mut Gen) -> Value {
    let mut out = Vec::new();
    let n = match g.below(10) {
        0..=5 => 0,
        6..=8 => 1,
        _ => 2,
    };
    for _ in 0..n {
        let expr = if g.chance(3) {
            g.pick(FAILING)
        } else {
            g.pick(SELECTORS)
        };
        out.push(json!({"cel": {"expression": expr}}));
    }
    Value::Array(out)
}

fn classes(g: &mut Gen, b: &mut Built) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..1 + g.below(3) {
        let name = format!("class-{i}");
        let mut spec = json!({"selectors": selectors(g)});
        if g.chance(20) {
            spec["config"] =
                json!([{"opaque": {"driver": GPU, "parameters": {"sharing": "timeSlicing"}}}]);
        }
        b.objects.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}));
        names.push(name);
    }
    names
}

fn exactly(g: &mut Gen, classes: &[String], allow_admin: bool) -> Value {
    let class = if g.chance(2) {
        "missing-class".to_string()
    } else {
        classes[g.below(classes.len() as u64) as usize].clone()
    };
    let mut r = json!({"deviceClassName": class, "selectors": selectors(g)});
    if g.chance(8) {
        r["allocationMode"] = json!("All");
    } else {
        r["count"] = json!(match g.below(10) {
            0..=6 => 1,
            7 | 8 => 2,
            _ => 3,
        });
    }
    if allow_admin && g.chance(5) {
        r["adminAccess"] = json!(true);
    }
    if g.chance(10) {
        r["tolerations"] =
            json!([{"key": "broken", "operator": g.pick(&["Exists", "Equal"]), "value": "yes"}]);
    }
    if g.chance(12) {
        r["capacity"] =
            json!({"requests": {"memory": g.pick(&["3Gi", "5Gi", "10Gi", "12Gi", "30Gi"])}});
    }
    r
}

fn claims(g: &mut Gen, b: &mut Built, classes: &[String]) {
    // Existing allocations.
    for i in 0..g.below(3) {
        if b.devices.is_empty() {
            break;
        }
        let mut results = Vec::new();
        for _ in 0..1 + g.below(2) {
            let (driver, pool, device, shareable) =
                b.devices[g.below(b.devices.len() as u64) as usize].clone();
            let mut r = json!({"request": "r", "driver": driver, "pool": pool, "device": device});
            if shareable && g.chance(70) {
                r["shareID"] = json!(format!("0000000{i}-0000-4000-8000-000000000000"));
                r["consumedCapacity"] = json!({"memory": g.pick(&["5Gi", "10Gi"])});
            }
            results.push(r);
        }
        b.objects.push(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("done-{i}"), "namespace": "ns", "uid": format!("uid-done-{i}")},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": classes[0]}}]}},
            "status": {"allocation": {"devices": {"results": results}}},
        }));
    }
    for c in 0..1 + g.below(2) {
        let mut requests = Vec::new();
        let n = match g.below(10) {
            0..=5 => 1,
            6..=8 => 2,
            _ => 3,
        };
        for r in 0..n {
            let name = format!("r{r}");
            if g.chance(20) {
                let subs: Vec<Value> = (0..2 + g.below(2))
                    .map(|s| {
                        let mut e = exactly(g, classes, false);
                        e["name"] = json!(format!("s{s}"));
                        e
                    })
                    .collect();
                requests.push(json!({"name": name, "firstAvailable": subs}));
            } else {
                requests.push(json!({"name": name, "exactly": exactly(g, classes, true)}));
            }
        }
        let mut devices = json!({"requests": requests});
        if g.chance(25) {
            let attribute = g.pick(&[
                "gpu.deckhouse.io/model",
                "gpu.deckhouse.io/type",
                "gpu.deckhouse.io/index",
                "gpu.deckhouse.io/zone",
            ]);
            let kind = if g.chance(50) {
                "matchAttribute"
            } else {
                "distinctAttribute"
            };
            let mut constraint = json!({kind: attribute});
            if g.chance(50) {
                constraint["requests"] = json!(["r0", format!("r{}", g.below(n))]);
            }
            devices["constraints"] = json!([constraint]);
        }
        if g.chance(15) {
            devices["config"] = json!([{"requests": [format!("r{}", g.below(n))], "opaque": {"driver": GPU, "parameters": {"mode": "x"}}}, {"opaque": {"driver": GPU, "parameters": {"all": true}}}]);
        }
        b.objects.push(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("claim-{c}"), "namespace": "ns", "uid": format!("uid-{c}")},
            "spec": {"devices": devices},
        }));
    }
}

fn case(seed: u64) -> Value {
    let mut g = Gen(seed);
    let mut b = Built {
        objects: Vec::new(),
        devices: Vec::new(),
    };
    b.objects.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": g.pick(&["a", "b"])}}}));
    pools(&mut g, &mut b);
    let classes = classes(&mut g, &mut b);
    claims(&mut g, &mut b, &classes);
    json!({"node": "n1", "objects": b.objects})
}

#[test]
fn decisions_match_the_kubernetes_allocator() {
    let cases: u64 = std::env::var("SWITCHYARD_ALLOC_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("SWITCHYARD_ALLOC_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let inputs: Vec<Value> = (0..cases)
        .map(|i| case(seed.wrapping_mul(1_000_003).wrapping_add(i)))
        .collect();
    let batch: String = inputs.iter().map(|c| format!("{c}\n")).collect();
    let answers = support::run_oracle_with("alloc-oracle", &["batch"], batch);
    let answers: Vec<&str> = answers.lines().collect();
    assert_eq!(answers.len(), inputs.len(), "the oracle answers every case");

    let compiler = Arc::new(Compiler::default());
    let mut by_result = std::collections::BTreeMap::<String, usize>::new();
    let mut mismatches = Vec::new();
    let mut messages_differ = 0;
    for (i, (input, answer)) in inputs.iter().zip(&answers).enumerate() {
        let theirs: Outcome =
            serde_json::from_str(answer).unwrap_or_else(|e| panic!("case {i}: {e}: {answer}"));
        let objects = Objects::from_values(input["objects"].as_array().unwrap().clone())
            .expect("generated objects read");
        let ours = objects.allocate("n1", compiler.clone());
        *by_result.entry(theirs.result.clone()).or_default() += 1;
        let same = ours.result == theirs.result
            && normalize(&serde_json::to_value(&ours.allocations).unwrap())
                == normalize(&serde_json::to_value(&theirs.allocations).unwrap());
        if !same {
            mismatches.push(format!(
                "case {i}:\n  input: {input}\n  kubernetes: {answer}\n  switchyard: {}",
                serde_json::to_string(&ours).unwrap()
            ));
        } else if ours.error != theirs.error {
            messages_differ += 1;
            if messages_differ <= 5 {
                eprintln!(
                    "case {i}: same failure, other words:\n  kubernetes: {:?}\n  switchyard: {:?}",
                    theirs.error, ours.error
                );
            }
        }
    }
    eprintln!(
        "{cases} cases, Kubernetes' results: {by_result:?}; {messages_differ} failures worded differently"
    );
    assert!(
        mismatches.is_empty(),
        "{} of {cases} cases differ; the first:\n{}",
        mismatches.len(),
        mismatches
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The generator must exercise every outcome, or the comparison proves little.
    for result in ["allocated", "unschedulable", "error"] {
        assert!(
            by_result.get(result).copied().unwrap_or(0) * 20 >= cases as usize,
            "too few {result} cases: {by_result:?}"
        );
    }
}
