//! A fixture machine shared by several nodes (`fixture-per-node:FILE`, the
//! chart's `nodeAgent.gpuSource=fixture`): each node's cards have UUIDs of
//! their own, as real cards do, the same on every reading; nothing else of
//! the machine changes.

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/fixtures/a100-8x-mig.yaml"
);

fn uuids(machine: &switchyard_gpu::Machine) -> Vec<String> {
    machine
        .gpus
        .iter()
        .flat_map(|g| {
            std::iter::once(g.uuid.clone()).chain(g.mig_devices.iter().map(|m| m.uuid.clone()))
        })
        .collect()
}

#[test]
fn each_node_gets_cards_of_its_own_and_the_same_ones_each_time() {
    let spec = format!("fixture-per-node:{FIXTURE}");
    let read = |node: &str| {
        switchyard_gpu::source_on(&spec, Some(node))
            .unwrap()
            .machine()
            .unwrap()
    };
    let shared = switchyard_gpu::source(&format!("fixture:{FIXTURE}"))
        .unwrap()
        .machine()
        .unwrap();
    let (a, b) = (read("gpu-0"), read("gpu-1"));
    assert!(
        uuids(&shared).iter().any(|u| u.starts_with("MIG-")),
        "the fixture has MIG devices"
    );
    for machine in [&a, &b] {
        assert_eq!(machine.gpus.len(), shared.gpus.len());
        for (mine, theirs) in uuids(machine).iter().zip(uuids(&shared)) {
            // The same shape (prefix, length, the part after the first
            // eight hex digits), another card.
            assert_eq!(mine.len(), theirs.len());
            assert_eq!(mine[..4], theirs[..4]);
            assert_eq!(mine[12..], theirs[12..]);
            assert_ne!(*mine, theirs);
            assert!(mine[4..12].chars().all(|c| c.is_ascii_hexdigit()), "{mine}");
        }
        for (mine, theirs) in machine.gpus.iter().zip(&shared.gpus) {
            assert_eq!(
                (mine.index, &mine.product_name, mine.memory_mib),
                (theirs.index, &theirs.product_name, theirs.memory_mib)
            );
        }
    }
    let (ua, ub) = (uuids(&a), uuids(&b));
    assert!(
        ua.iter().all(|u| !ub.contains(u)),
        "two nodes share a card: {ua:?} {ub:?}"
    );
    assert_eq!(uuids(&read("gpu-0")), ua, "the same node, the same cards");

    let refused = switchyard_gpu::source(&spec)
        .err()
        .expect("refused without a node");
    assert!(
        refused.to_string().contains("needs the node's name"),
        "{refused}"
    );
}
