//! The node's ResourceSlices on the API server: published by Server-Side
//! Apply under the agent's field manager, the slices of an older publication
//! that the new one no longer has deleted, and all of them withdrawn when
//! the node stops serving DRA.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use switchyard_gpu::publish::DRIVER;

use super::FIELD_MANAGER;
use super::agent::{SliceError, SlicePublisher};

/// How long a switch to DRA waits for kubelet to write the Node's status
/// without the device plugins' devices.
const UNADVERTISE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Slices of one node, through the API server.
pub struct ApiSlices {
    api: Api<ResourceSlice>,
    node: String,
}

impl ApiSlices {
    pub fn new(client: kube::Client, node: &str) -> ApiSlices {
        ApiSlices {
            api: Api::all(client),
            node: node.to_string(),
        }
    }

    /// The names of this node's slices of this driver.
    async fn existing(&self) -> Result<Vec<String>, SliceError> {
        let selector = format!("spec.nodeName={},spec.driver={DRIVER}", self.node);
        let list = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|source| SliceError::List { source })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect())
    }

    async fn delete(&self, name: &str) -> Result<(), SliceError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(SliceError::Delete {
                name: name.to_string(),
                source,
            }),
        }
    }
}

#[async_trait::async_trait]
impl SlicePublisher for ApiSlices {
    async fn publish(&self, slices: Vec<ResourceSlice>) -> Result<(), SliceError> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut names = Vec::new();
        for slice in slices {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let mut object = serde_json::to_value(&slice).map_err(|source| SliceError::Encode {
                name: name.clone(),
                source,
            })?;
            object["apiVersion"] = "resource.k8s.io/v1".into();
            object["kind"] = "ResourceSlice".into();
            self.api
                .patch(&name, &params, &Patch::Apply(object))
                .await
                .map_err(|source| SliceError::Apply {
                    name: name.clone(),
                    source,
                })?;
            names.push(name);
        }
        for stale in self
            .existing()
            .await?
            .into_iter()
            .filter(|n| !names.contains(n))
        {
            self.delete(&stale).await?;
        }
        Ok(())
    }

    async fn wait_unadvertised(&self, resources: &[String]) -> Result<(), SliceError> {
        let nodes: Api<Node> = Api::all(self.api.clone().into_client());
        let gone = |node: Option<&Node>| {
            let allocatable = node
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.allocatable.as_ref());
            resources.iter().all(|r| {
                allocatable
                    .and_then(|a| a.get(r))
                    .is_none_or(|q| q.0 == "0")
            })
        };
        let waited = tokio::time::timeout(
            UNADVERTISE_WAIT,
            kube::runtime::wait::await_condition(nodes, &self.node, gone),
        )
        .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(SliceError::WatchNode(e.to_string())),
            Err(_) => Err(SliceError::StillAdvertised {
                resources: resources.to_vec(),
                waited: UNADVERTISE_WAIT,
            }),
        }
    }

    async fn withdraw(&self) -> Result<(), SliceError> {
        for name in self.existing().await? {
            self.delete(&name).await?;
        }
        Ok(())
    }
}
