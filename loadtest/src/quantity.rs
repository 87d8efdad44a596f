//! Quantities: ours against Kubernetes' own (tools/quantity-oracle, Go, same
//! machine, same run) on the shapes DRA capacities and selectors use.

use std::hint::black_box;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};
use switchyard_dra::Quantity;

#[derive(clap::Args)]
pub struct Args {
    /// Operations per measurement.
    #[arg(long, default_value_t = 1_000_000)]
    iterations: u32,
}

fn go_bench(binary: &str, requests: &[String]) -> anyhow::Result<Vec<f64>> {
    let mut child = Command::new(binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all((requests.join("\n") + "\n").as_bytes())?;
    let out = child.wait_with_output()?;
    String::from_utf8(out.stdout)?
        .lines()
        .map(|l| {
            l.strip_prefix("ok ")
                .ok_or_else(|| anyhow::anyhow!("oracle: {l}"))?
                .parse::<f64>()
                .map_err(Into::into)
        })
        .collect()
}

fn ns_per(iterations: u32, mut op: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        op();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations)
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.iterations;
    let oracle = crate::oracle("quantity-oracle")?;
    let parses = ["40Gi", "1500m", "8", "42949672961", "1.5Gi"];
    let compares = [("40Gi", "42949672961"), ("1500m", "2"), ("80Gi", "80Gi")];
    let mut requests: Vec<String> = parses
        .iter()
        .map(|s| format!("bench parse {s} {n}"))
        .collect();
    requests.extend(
        compares
            .iter()
            .map(|(a, b)| format!("bench cmp {a} {b} {n}")),
    );
    let go = go_bench(&oracle, &requests)?;
    let mut rows = Vec::new();
    for (i, s) in parses.iter().enumerate() {
        let ours = ns_per(n, || {
            black_box(Quantity::parse(black_box(s)).ok());
        });
        rows.push(json!({"op": format!("parse {s}"), "ours_ns": ours, "kubernetes_ns": go[i], "kubernetes_over_ours": go[i] / ours}));
    }
    for (j, (a, b)) in compares.iter().enumerate() {
        let (qa, qb) = (Quantity::parse(a)?, Quantity::parse(b)?);
        let ours = ns_per(n, || {
            black_box(black_box(&qa).cmp(black_box(&qb)));
        });
        let theirs = go[parses.len() + j];
        rows.push(json!({"op": format!("cmp {a} {b}"), "ours_ns": ours, "kubernetes_ns": theirs, "kubernetes_over_ours": theirs / ours}));
    }
    // Selector evaluation per device, compiled once (the common shapes).
    let compiler = switchyard_dra::cel::Compiler::default();
    let device = switchyard_dra::cel::Device {
        driver: "gpu.deckhouse.io".into(),
        allow_multiple_allocations: false,
        attributes: [
            (
                "model".to_string(),
                switchyard_dra::cel::Attribute::String("a100-sxm4-40gb".into()),
            ),
            ("index".to_string(), switchyard_dra::cel::Attribute::Int(3)),
        ]
        .into(),
        capacity: [("memory".to_string(), Quantity::parse("40Gi")?)].into(),
    };
    let selectors = [
        "device.attributes['gpu.deckhouse.io'].model == 'a100-sxm4-40gb'",
        "device.capacity['gpu.deckhouse.io'].memory.isGreaterThan(quantity('32Gi'))",
        "device.attributes['gpu.deckhouse.io'].model.matches('^a100')",
    ];
    let mut selector_rows = Vec::new();
    for expr in selectors {
        let compiled = compiler.compile(expr);
        let selector = compiled
            .as_ref()
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{expr}: {e}"))?;
        let per = ns_per(n / 20, || {
            black_box(compiler.matches(selector, black_box(&device)).ok());
        });
        let prepared = compiler
            .prepare(&device)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let per_prepared = ns_per(n / 20, || {
            black_box(
                compiler
                    .matches_prepared(selector, black_box(&prepared))
                    .ok(),
            );
        });
        selector_rows.push(json!({"selector": expr, "ours_ns": per, "ours_prepared_ns": per_prepared, "target_ns": 1000}));
    }
    Ok(json!({"iterations": n, "results": rows, "selectors": selector_rows}))
}
