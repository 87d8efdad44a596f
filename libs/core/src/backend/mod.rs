//! The stack backends: who serves a node's GPUs once the stack-assigner has
//! decided its stack.
//!
//! - `deckhouse`: Switchyard's node agent serves both stacks; the stack is
//!   the `node.deckhouse.io/gpu-stack` label it watches.
//! - `nvidia-operator`: NVIDIA's GPU Operator (device plugin, GFD, validator,
//!   DCGM as per-node operands) and NVIDIA's DRA driver (`gpu.nvidia.com`)
//!   serve the GPUs; Switchyard only writes the node labels those watch and
//!   checks what they did (the NVIDIA guide's
//!   "Build Separate Legacy and DRA Node Pools", "Disable the Device Plugin
//!   Only on DRA Nodes"). The upstream facts each rule rests on are listed,
//!   with their sources, in `docs/design/nvidia-operator-backend.md` (F1–F19).
//!
//! This module holds the backends' settings as the log records them, the
//! NVIDIA names and the one table of labels per stack that the core, the
//! simulator, the edge and `doctor` share. What each backend decides is its
//! [`strategy::Strategy`]: [`deckhouse`] and [`nvidia_operator`] (with the
//! operator's label writes in [`operands`]).

pub mod deckhouse;
pub mod dispatch;
pub mod nvidia_operator;
pub mod operands;
pub mod strategy;

use std::collections::BTreeMap;

use crate::selector::PodSelector;
use switchyard_proto::v1::{
    Backend as BackendKind, BackendConfigured, NvidiaOperatorSettings, Stack,
};

/// Which backend serves the GPUs, as recorded in the log (`BackendConfigured`;
/// none recorded: `deckhouse`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Backend {
    #[default]
    Deckhouse,
    NvidiaOperator(Box<NvidiaOperator>),
}

impl Backend {
    /// The label that names a node's group: `node.deckhouse.io/group`, or on
    /// the `nvidia-operator` backend the pool label.
    pub fn group_label(&self) -> &str {
        match self {
            Backend::Deckhouse => crate::names::GROUP_LABEL,
            Backend::NvidiaOperator(n) => &n.pool_label,
        }
    }

    /// As recorded in the log.
    pub fn to_event(&self) -> BackendConfigured {
        match self {
            Backend::Deckhouse => BackendConfigured {
                backend: BackendKind::Deckhouse as i32,
                nvidia_operator: None,
            },
            Backend::NvidiaOperator(n) => BackendConfigured {
                backend: BackendKind::NvidiaOperator as i32,
                nvidia_operator: Some(Box::new(NvidiaOperatorSettings {
                    domain: n.domain.clone(),
                    plugin_label: n.plugin_label.clone(),
                    pilot_taint: n.pilot_taint,
                    disable_validator_on_dra: n.disable_validator_on_dra,
                    pool_label: n.pool_label.clone(),
                    pools: n
                        .pools
                        .iter()
                        .map(|(pool, stack)| (pool.clone(), *stack as i32))
                        .collect(),
                    device_plugin_pods: n.device_plugin_pods.text.clone(),
                    device_plugin_pods_selector: n.device_plugin_pods.selector.clone(),
                    kubelet_plugin_pods: n.kubelet_plugin_pods.text.clone(),
                    kubelet_plugin_pods_selector: n.kubelet_plugin_pods.selector.clone(),
                })),
            },
        }
    }

    /// As a record names it; a record of a backend this build does not know
    /// reads as `deckhouse`, the one that writes no NVIDIA label.
    pub fn from_event(e: &BackendConfigured) -> Backend {
        match (e.backend(), &e.nvidia_operator) {
            (BackendKind::NvidiaOperator, Some(n)) => {
                Backend::NvidiaOperator(Box::new(NvidiaOperator {
                    domain: n.domain.clone(),
                    plugin_label: n.plugin_label.clone(),
                    pilot_taint: n.pilot_taint,
                    disable_validator_on_dra: n.disable_validator_on_dra,
                    pool_label: n.pool_label.clone(),
                    pools: n
                        .pools
                        .iter()
                        .map(|(pool, stack)| {
                            (
                                pool.clone(),
                                Stack::try_from(*stack).unwrap_or(Stack::Unspecified),
                            )
                        })
                        .collect(),
                    device_plugin_pods: PodSelector {
                        text: n.device_plugin_pods.clone(),
                        selector: n.device_plugin_pods_selector.clone(),
                    },
                    kubelet_plugin_pods: PodSelector {
                        text: n.kubelet_plugin_pods.clone(),
                        selector: n.kubelet_plugin_pods_selector.clone(),
                    },
                }))
            }
            (BackendKind::NvidiaOperator, None) => Backend::NvidiaOperator(Box::default()),
            _ => Backend::Deckhouse,
        }
    }

    /// The DRA driver that publishes the cards: Switchyard's node agent's,
    /// or NVIDIA's.
    pub fn driver(&self) -> &'static str {
        match self {
            Backend::Deckhouse => crate::names::GPU_DRIVER,
            Backend::NvidiaOperator(_) => nvidia::DRIVER,
        }
    }

    /// The `nvidia-operator` backend's settings, where it is that backend.
    pub fn nvidia_operator(&self) -> Option<&NvidiaOperator> {
        match self {
            Backend::NvidiaOperator(settings) => Some(settings),
            Backend::Deckhouse => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Deckhouse => "deckhouse",
            Backend::NvidiaOperator(_) => "nvidia-operator",
        }
    }
}

/// The GPU Operator's operand deploy labels (F1): a DaemonSet runs on a node
/// while its label reads `"true"`.
pub mod nvidia {
    /// The device plugin's deploy label (the MPS control daemon selects on it too, F2).
    pub const DEPLOY_DEVICE_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
    /// The operator validator's deploy label: off on DRA nodes (gpu-operator#2550, F19).
    pub const DEPLOY_OPERATOR_VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
    /// Turns every operand off at once (F4): Switchyard never writes it.
    pub const DEPLOY_OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
    /// The prefix of every operand deploy label.
    pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
    /// The operands Switchyard never disables (the guide: "Do not disable the
    /// driver, container toolkit, GPU Feature Discovery, DCGM exporter, or
    /// other required operands").
    pub const NEVER_WRITTEN: [&str; 5] = [
        "nvidia.com/gpu.deploy.driver",
        "nvidia.com/gpu.deploy.container-toolkit",
        "nvidia.com/gpu.deploy.gpu-feature-discovery",
        "nvidia.com/gpu.deploy.dcgm",
        "nvidia.com/gpu.deploy.dcgm-exporter",
    ];
    /// Deploy labels are set only on nodes labelled so (F4).
    pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
    /// The DRA kubelet plugin's node label in NVIDIA's install instructions
    /// and the guide (F8); the DRA chart selects on it only when its values
    /// say so (F9).
    pub const DRA_KUBELET_PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";
    /// The driver-manager variable that must name [`DRA_KUBELET_PLUGIN`] (F7, F8).
    pub const EVICTION_LABEL_ENV: &str = "NODE_LABEL_FOR_GPU_POD_EVICTION";
    /// What the driver manager writes into a deploy label while it reloads
    /// the driver (F7): `true` becomes this, other values get `_` and this
    /// appended; `false` is left alone.
    pub const PAUSED: &str = "paused-for-driver-upgrade";
    /// The DRA driver's name and its classes (F11, F14).
    pub const DRIVER: &str = "gpu.nvidia.com";
    pub const DRIVER_CLASSES: [&str; 3] =
        ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"];
    /// Pod labels of the operands (F3) and of the DRA kubelet plugin (F9).
    pub const DEVICE_PLUGIN_POD: (&str, &str) = ("app", "nvidia-device-plugin-daemonset");
    pub const VALIDATOR_POD: (&str, &str) = ("app", "nvidia-operator-validator");
    pub const KUBELET_PLUGIN_POD: (&str, &str) =
        ("dra-driver-nvidia-gpu-component", "kubelet-plugin");
    /// GPU Feature Discovery's labels (F18).
    pub const GFD_PRODUCT: &str = "nvidia.com/gpu.product";
    pub const GFD_COUNT: &str = "nvidia.com/gpu.count";
    pub const GFD_MEMORY_MIB: &str = "nvidia.com/gpu.memory";
    /// The guide's ownership label and pilot taint, under a platform domain.
    pub const DEFAULT_DOMAIN: &str = "gpu-scheduling.platform.example.com";
    pub const MODE_LEGACY: &str = "legacy";
    pub const MODE_DRA: &str = "dra";
}

/// How the `nvidia-operator` backend writes a node's stack.
#[derive(Clone, Debug, PartialEq)]
pub struct NvidiaOperator {
    /// The domain of the ownership label `<domain>/mode` and of the pilot
    /// taint `<domain>/mode=dra:NoSchedule`.
    pub domain: String,
    /// The label the DRA kubelet plugin's DaemonSet selects (F9).
    pub plugin_label: String,
    /// Whether DRA nodes get the pilot taint, so that unchanged
    /// `nvidia.com/gpu` pods do not land there through the driver's own
    /// extended-resource class (F14).
    pub pilot_taint: bool,
    /// Whether DRA nodes get `gpu.deploy.operator-validator=false` (F19).
    pub disable_validator_on_dra: bool,
    /// The node label naming a node's pool (`<domain>/pool`).
    pub pool_label: String,
    /// Each pool's stack. A GPU node in no pool listed is left to the
    /// operator's default, the device plugin.
    pub pools: BTreeMap<String, Stack>,
    /// The device plugin's pods (F3).
    pub device_plugin_pods: PodSelector,
    /// The DRA kubelet plugin's pods (F9).
    pub kubelet_plugin_pods: PodSelector,
}

impl Default for NvidiaOperator {
    fn default() -> Self {
        NvidiaOperator {
            domain: nvidia::DEFAULT_DOMAIN.into(),
            plugin_label: nvidia::DRA_KUBELET_PLUGIN.into(),
            pilot_taint: true,
            disable_validator_on_dra: true,
            pool_label: format!("{}/pool", nvidia::DEFAULT_DOMAIN),
            pools: BTreeMap::new(),
            device_plugin_pods: pod_selector(nvidia::DEVICE_PLUGIN_POD),
            kubelet_plugin_pods: pod_selector(nvidia::KUBELET_PLUGIN_POD),
        }
    }
}

/// `--nvidia-pools`: `pool=stack` pairs joined by commas (`legacy=device-plugin,dra-pilot=dra`),
/// stacks named `device-plugin`, `dra` or `none`.
pub fn parse_pools(text: &str) -> Result<BTreeMap<String, Stack>, String> {
    let mut pools = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((pool, stack)) = pair.split_once('=') else {
            return Err(format!("{pair:?}: expected POOL=STACK, e.g. dra-pilot=dra"));
        };
        let (pool, stack) = (pool.trim(), stack.trim());
        let stack = match stack {
            "device-plugin" => Stack::DevicePlugin,
            "dra" => Stack::Dra,
            "none" => Stack::None,
            other => {
                return Err(format!(
                    "pool {pool}: stack {other:?}: expected device-plugin, dra or none"
                ));
            }
        };
        if pool.is_empty()
            || !pool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!(
                "pool {pool:?}: expected a label value (letters, digits, '-', '_', '.')"
            ));
        }
        if pools.insert(pool.to_string(), stack).is_some() {
            return Err(format!("pool {pool}: named twice"));
        }
    }
    Ok(pools)
}

/// The pods labelled `key=value`.
fn pod_selector((key, value): (&str, &str)) -> PodSelector {
    PodSelector::parse(&format!("{key}={value}")).expect("a built-in selector parses")
}

/// What a stack asks of one label: this value, or absent.
pub type Wanted = Option<&'static str>;

impl NvidiaOperator {
    /// The ownership label, `<domain>/mode`.
    pub fn mode_label(&self) -> String {
        format!("{}/mode", self.domain)
    }

    /// The labels `stack` asks for, as a merge patch would write them (`None`
    /// removes the key); labels not named are left as found. The guide's
    /// table: the device plugin on (and the validator), or the device plugin
    /// off, the validator off where configured and the plugin label on; the
    /// ownership label naming the pool. A node on no stack loses the plugin
    /// label and the ownership label and keeps the operator's labels.
    pub fn operand_labels(&self, stack: Stack) -> BTreeMap<String, Wanted> {
        let mut labels = BTreeMap::new();
        match stack {
            Stack::DevicePlugin => {
                labels.insert(nvidia::DEPLOY_DEVICE_PLUGIN.into(), Some("true"));
                labels.insert(nvidia::DEPLOY_OPERATOR_VALIDATOR.into(), Some("true"));
                labels.insert(self.plugin_label.clone(), None);
                labels.insert(self.mode_label(), Some(nvidia::MODE_LEGACY));
            }
            Stack::Dra => {
                labels.insert(nvidia::DEPLOY_DEVICE_PLUGIN.into(), Some("false"));
                if self.disable_validator_on_dra {
                    labels.insert(nvidia::DEPLOY_OPERATOR_VALIDATOR.into(), Some("false"));
                }
                labels.insert(self.plugin_label.clone(), Some("true"));
                labels.insert(self.mode_label(), Some(nvidia::MODE_DRA));
            }
            Stack::None | Stack::Unspecified => {
                labels.insert(self.plugin_label.clone(), None);
                labels.insert(self.mode_label(), None);
            }
        }
        labels
    }

    /// Whether `labels` read as `stack` asks: every label it names, as it
    /// names it. A paused deploy label (F7) reads as the value it was
    /// paused from.
    pub fn labels_read_as(&self, stack: Stack, labels: &BTreeMap<String, String>) -> bool {
        self.operand_labels(stack).iter().all(|(key, wanted)| {
            let found = labels.get(key).map(String::as_str);
            match (wanted, found) {
                (None, found) => found.is_none(),
                (Some(wanted), found) if key.starts_with(nvidia::DEPLOY_PREFIX) => {
                    DeployLabel::read(found).value() == Some(*wanted)
                }
                (Some(wanted), found) => found == Some(*wanted),
            }
        })
    }
}

/// An operand deploy label as the GPU Operator and its driver manager read
/// it (F4, F7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeployLabel<'a> {
    /// Absent or `""`: the operator's labeller sets it to `true`.
    Missing,
    /// A value the labeller keeps: `true` runs the operand, anything else
    /// (`false` among them) does not.
    Set(&'a str),
    /// The driver manager paused the operand during a driver upgrade and
    /// will restore this value (`true` for `paused-for-driver-upgrade`).
    Paused(&'a str),
}

impl<'a> DeployLabel<'a> {
    pub fn read(value: Option<&'a str>) -> DeployLabel<'a> {
        match value {
            None | Some("") => DeployLabel::Missing,
            Some(nvidia::PAUSED) => DeployLabel::Paused("true"),
            Some(v) => match v
                .strip_suffix(nvidia::PAUSED)
                .and_then(|v| v.strip_suffix('_'))
            {
                Some(before) => DeployLabel::Paused(before),
                None => DeployLabel::Set(v),
            },
        }
    }

    /// The value the operator will act on once any pause ends: `true` for
    /// a missing label, which the labeller fills in.
    pub fn value(self) -> Option<&'a str> {
        match self {
            DeployLabel::Missing => Some("true"),
            DeployLabel::Set(v) | DeployLabel::Paused(v) => Some(v),
        }
    }

    /// Whether the operand runs (or will run once the pause ends).
    pub fn on(self) -> bool {
        self.value() == Some("true")
    }

    pub fn paused(self) -> bool {
        matches!(self, DeployLabel::Paused(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pools_are_read_from_the_flag_and_bad_ones_are_refused_by_name() {
        assert_eq!(
            parse_pools("legacy=device-plugin, dra-pilot=dra,idle=none"),
            Ok(BTreeMap::from([
                ("dra-pilot".to_string(), Stack::Dra),
                ("idle".to_string(), Stack::None),
                ("legacy".to_string(), Stack::DevicePlugin),
            ]))
        );
        assert_eq!(parse_pools(""), Ok(BTreeMap::new()));
        assert_eq!(
            parse_pools("dra-pilot"),
            Err("\"dra-pilot\": expected POOL=STACK, e.g. dra-pilot=dra".into())
        );
        assert_eq!(
            parse_pools("dra-pilot=DRA"),
            Err("pool dra-pilot: stack \"DRA\": expected device-plugin, dra or none".into())
        );
        assert_eq!(
            parse_pools("a=dra,a=none"),
            Err("pool a: named twice".into())
        );
        assert!(
            parse_pools("a b=dra")
                .unwrap_err()
                .contains("expected a label value")
        );
    }

    #[test]
    fn the_guides_labels_per_stack() {
        let backend = NvidiaOperator::default();
        let wanted = |stack| {
            backend
                .operand_labels(stack)
                .into_iter()
                .collect::<Vec<(String, Wanted)>>()
        };
        assert_eq!(
            wanted(Stack::Dra),
            vec![
                (
                    "gpu-scheduling.platform.example.com/mode".into(),
                    Some("dra")
                ),
                ("nvidia.com/dra-kubelet-plugin".into(), Some("true")),
                ("nvidia.com/gpu.deploy.device-plugin".into(), Some("false")),
                (
                    "nvidia.com/gpu.deploy.operator-validator".into(),
                    Some("false")
                ),
            ]
        );
        assert_eq!(
            wanted(Stack::DevicePlugin),
            vec![
                (
                    "gpu-scheduling.platform.example.com/mode".into(),
                    Some("legacy")
                ),
                ("nvidia.com/dra-kubelet-plugin".into(), None),
                ("nvidia.com/gpu.deploy.device-plugin".into(), Some("true")),
                (
                    "nvidia.com/gpu.deploy.operator-validator".into(),
                    Some("true")
                ),
            ]
        );
        assert_eq!(
            wanted(Stack::None),
            vec![
                ("gpu-scheduling.platform.example.com/mode".into(), None),
                ("nvidia.com/dra-kubelet-plugin".into(), None),
            ]
        );
        // The validator stays on where the operator no longer needs it off.
        let fixed = NvidiaOperator {
            disable_validator_on_dra: false,
            domain: "gpu.example.org".into(),
            ..NvidiaOperator::default()
        };
        let dra = fixed.operand_labels(Stack::Dra);
        assert!(!dra.contains_key(nvidia::DEPLOY_OPERATOR_VALIDATOR));
        assert_eq!(dra["gpu.example.org/mode"], Some("dra"));
    }

    #[test]
    fn the_operands_dra_needs_are_never_written() {
        let backend = NvidiaOperator::default();
        for stack in [Stack::Dra, Stack::DevicePlugin, Stack::None] {
            let wanted = backend.operand_labels(stack);
            for kept in nvidia::NEVER_WRITTEN
                .iter()
                .chain([&nvidia::DEPLOY_OPERANDS])
            {
                assert!(!wanted.contains_key(*kept), "{stack:?} writes {kept}");
            }
        }
    }

    #[test]
    fn an_empty_label_is_missing_and_a_paused_one_keeps_its_value() {
        assert_eq!(DeployLabel::read(None), DeployLabel::Missing);
        assert_eq!(DeployLabel::read(Some("")), DeployLabel::Missing);
        assert!(
            DeployLabel::read(Some("")).on(),
            "the labeller fills in true"
        );
        assert_eq!(DeployLabel::read(Some("false")), DeployLabel::Set("false"));
        assert!(!DeployLabel::read(Some("false")).on());
        let paused = DeployLabel::read(Some("paused-for-driver-upgrade"));
        assert_eq!(paused, DeployLabel::Paused("true"));
        assert!(paused.on() && paused.paused());
        let other = DeployLabel::read(Some("custom_paused-for-driver-upgrade"));
        assert_eq!(other, DeployLabel::Paused("custom"));
        assert!(!other.on());
    }

    #[test]
    fn labels_read_as_a_stack_through_a_driver_upgrade_pause() {
        let backend = NvidiaOperator::default();
        let on_dra = labels(&[
            ("gpu-scheduling.platform.example.com/mode", "dra"),
            ("nvidia.com/dra-kubelet-plugin", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "false"),
            ("nvidia.com/gpu.deploy.operator-validator", "false"),
            ("nvidia.com/gpu.deploy.driver", "true"),
        ]);
        assert!(backend.labels_read_as(Stack::Dra, &on_dra));
        assert!(!backend.labels_read_as(Stack::DevicePlugin, &on_dra));
        let legacy = labels(&[
            ("gpu-scheduling.platform.example.com/mode", "legacy"),
            // Paused by the driver manager: still the device plugin's node.
            (
                "nvidia.com/gpu.deploy.device-plugin",
                "paused-for-driver-upgrade",
            ),
            (
                "nvidia.com/gpu.deploy.operator-validator",
                "paused-for-driver-upgrade",
            ),
        ]);
        assert!(backend.labels_read_as(Stack::DevicePlugin, &legacy));
        // Missing deploy labels read as true (the labeller adds them).
        let fresh = labels(&[("gpu-scheduling.platform.example.com/mode", "legacy")]);
        assert!(backend.labels_read_as(Stack::DevicePlugin, &fresh));
        assert!(!backend.labels_read_as(Stack::Dra, &fresh));
    }
}
