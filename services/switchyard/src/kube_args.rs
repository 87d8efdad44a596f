//! The flags of commands that read the cluster directly, as kubectl spells
//! them: `--kubeconfig`, `--context`, `-n/--namespace`, `-A/--all-namespaces`.

use anyhow::Context;
use clap::Args;

/// Which cluster to talk to: a kubeconfig (default `KUBECONFIG`, then
/// `~/.kube/config`, then the in-cluster config) and a context in it.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// The kubeconfig file; default: $KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use; default: its current context.
    #[arg(long, env = "SWITCHYARD_CONTEXT")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// A client for the chosen cluster and context.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("read the kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("use the kubeconfig {}", path.display()))?
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .context("use the kubeconfig's context")?,
            None => kube::Config::infer()
                .await
                .context("find a cluster: no KUBECONFIG, ~/.kube/config or in-cluster config")?,
        };
        kube::Client::try_from(config).context("make a Kubernetes client")
    }
}

/// Which namespaces a listing covers, as kubectl's `-n` and `-A`.
#[derive(Args, Debug, Clone, Default)]
pub struct NamespaceArgs {
    /// Only this namespace.
    #[arg(
        short = 'n',
        long,
        env = "SWITCHYARD_NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,
    /// Every namespace (the default for commands that survey the cluster).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

impl NamespaceArgs {
    /// The one namespace asked for, or `None` for all of them.
    pub fn only(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}
