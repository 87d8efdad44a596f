//! `backend`: the stack backend reaches inventory and the stack-assigner,
//! and on `nvidia-operator` the stack-assigner gets the `nvidiaOperator`
//! values, pools in a stable order; values the services would refuse are
//! refused by the chart first.

use crate::monitoring::container_env;
use crate::support::{NATS_URL, render, template};

fn env_of(sets: &[&str], container: &str) -> Vec<(String, String)> {
    container_env(&render(sets))
        .into_iter()
        .find(|(name, _)| name == container)
        .unwrap_or_else(|| panic!("no container {container}"))
        .1
}

fn value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn the_backend_reaches_inventory_and_the_stack_assigner() {
    for container in ["inventory", "stack-assigner"] {
        let env = env_of(&[NATS_URL], container);
        assert_eq!(
            value(&env, "SWITCHYARD_BACKEND"),
            Some("deckhouse"),
            "{container}"
        );
        assert!(
            env.iter()
                .all(|(n, _)| !n.starts_with("SWITCHYARD_NVIDIA_")),
            "{container}: {env:?}"
        );
    }
    let sets = [
        NATS_URL,
        "backend=nvidia-operator",
        "nvidiaOperator.pools.legacy=device-plugin",
        "nvidiaOperator.pools.dra-pilot=dra",
        "nvidiaOperator.domain=gpu.example.org",
    ];
    assert_eq!(
        value(&env_of(&sets, "inventory"), "SWITCHYARD_BACKEND"),
        Some("nvidia-operator")
    );
    let env = env_of(&sets, "stack-assigner");
    for (name, expected) in [
        ("SWITCHYARD_BACKEND", "nvidia-operator"),
        (
            "SWITCHYARD_NVIDIA_POOLS",
            "dra-pilot=dra,legacy=device-plugin",
        ),
        ("SWITCHYARD_NVIDIA_DOMAIN", "gpu.example.org"),
        (
            "SWITCHYARD_NVIDIA_PLUGIN_LABEL",
            "nvidia.com/dra-kubelet-plugin",
        ),
        ("SWITCHYARD_NVIDIA_POOL_LABEL", ""),
        ("SWITCHYARD_NVIDIA_PILOT_TAINT", "true"),
        ("SWITCHYARD_NVIDIA_DISABLE_VALIDATOR_ON_DRA", "true"),
        (
            "SWITCHYARD_NVIDIA_DEVICE_PLUGIN_PODS",
            "app=nvidia-device-plugin-daemonset",
        ),
        (
            "SWITCHYARD_NVIDIA_KUBELET_PLUGIN_PODS",
            "dra-driver-nvidia-gpu-component=kubelet-plugin",
        ),
    ] {
        assert_eq!(value(&env, name), Some(expected), "{name}: {env:?}");
    }
    // The other services are not told.
    let claim_allocator = env_of(&sets, "claim-allocator");
    assert_eq!(value(&claim_allocator, "SWITCHYARD_BACKEND"), None);
}

#[test]
fn a_backend_or_pool_stack_the_services_would_refuse_is_refused_by_the_chart() {
    for (set, field) in [
        ("backend=nvidia", "/backend"),
        (
            "nvidiaOperator.pools.dra-pilot=DRA",
            "/nvidiaOperator/pools/dra-pilot",
        ),
        (
            "nvidiaOperator.domain=Not_A_Domain",
            "/nvidiaOperator/domain",
        ),
    ] {
        let run = template(&[NATS_URL, set]);
        assert!(!run.ok, "{set} rendered");
        assert!(run.stderr.contains(field), "{set}: {}", run.stderr);
    }
}
