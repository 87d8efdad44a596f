//! The class-compiler's writers: a GPU class's DeviceClasses
//! (Server-Side Apply, owned) and status, its namespace restriction (a
//! ValidatingAdmissionPolicy and its binding), and a retired class's removal.

use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use switchyard_api::GPUClass;
use switchyard_core::ServiceName;
use switchyard_core::effects::{Effect, Outcome};
use switchyard_kube::write::{Edge, EdgeError, Writer, Writes, not_owned};

use crate::SERVICE;

/// The class-compiler's writers (field manager `switchyard-class-compiler`), as the
/// runtime's executor.
pub type ClassCompilerEdge = Edge<ClassCompilerWrites>;

/// How the class-compiler writes each effect it owns.
#[derive(Clone)]
pub struct ClassCompilerWrites {
    writer: Writer,
}

impl Writes for ClassCompilerWrites {
    const SERVICE: ServiceName = SERVICE;

    fn new(writer: Writer) -> Self {
        ClassCompilerWrites { writer }
    }

    fn writer(&self) -> &Writer {
        &self.writer
    }

    async fn write(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        match effect {
            Effect::PublishDeviceClasses {
                gpu_class,
                variants,
                refused,
                namespaces,
            } => {
                self.restrict_namespaces(gpu_class, variants, namespaces)
                    .await?;
                self.publish_device_classes(gpu_class, variants, refused.as_deref())
                    .await
            }
            Effect::RetireDeviceClasses {
                gpu_class,
                device_classes,
            } => self.retire_device_classes(gpu_class, device_classes).await,
            other => not_owned::<Self>(other),
        }
    }
}

impl ClassCompilerWrites {
    /// The class's namespace restriction: a ValidatingAdmissionPolicy, bound
    /// to every namespace but the allowed ones, that refuses ResourceClaims,
    /// ResourceClaimTemplates and pods using the class's DeviceClasses or
    /// extended resources. No restriction: the policy and binding are removed.
    async fn restrict_namespaces(
        &self,
        gpu_class: &str,
        variants: &[switchyard_proto::v1::CompiledVariant],
        namespaces: &[String],
    ) -> Result<(), EdgeError> {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let name = format!("switchyard-gpuclass-{gpu_class}");
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.writer.client());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.writer.client());
        if namespaces.is_empty() {
            for result in [
                bindings.delete(&name, &Default::default()).await.map(drop),
                policies.delete(&name, &Default::default()).await.map(drop),
            ] {
                match result {
                    Ok(()) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(err) => {
                        return Err(EdgeError::api(format!(
                            "remove the restriction of GPUClass {gpu_class}"
                        ))(err));
                    }
                }
            }
            return Ok(());
        }
        let list = |items: Vec<&str>| {
            format!(
                "[{}]",
                items
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let classes = list(variants.iter().map(|v| v.device_class.as_str()).collect());
        let resources = list(
            variants
                .iter()
                .map(|v| v.extended_resource_name.as_str())
                .collect(),
        );
        let requests = |devices: &str| {
            format!(
                "!has({devices}) || !has({devices}.requests) || {devices}.requests.all(r,                  (!has(r.exactly) || !(r.exactly.deviceClassName in {classes})) &&                  (!has(r.firstAvailable) || r.firstAvailable.all(s, !(s.deviceClassName in {classes}))))"
            )
        };
        let containers = |field: &str| {
            format!(
                "!has(object.spec.{field}) || object.spec.{field}.all(c, !has(c.resources) ||                  {resources}.all(x, (!has(c.resources.limits) || !(x in c.resources.limits)) &&                  (!has(c.resources.requests) || !(x in c.resources.requests))))"
            )
        };
        let message = format!(
            "GPU class {gpu_class} may only be used in the namespaces {}",
            namespaces.join(", ")
        );
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"gpu.deckhouse.io/class": gpu_class}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["resourceclaims", "resourceclaimtemplates"]},
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                ]},
                "validations": [
                    {"expression": format!("request.resource.resource != 'resourceclaims' || {}", requests("object.spec.devices")), "message": message},
                    {"expression": format!("request.resource.resource != 'resourceclaimtemplates' || {}", requests("object.spec.spec.devices")), "message": message},
                    {"expression": format!("request.resource.resource != 'pods' || (({}) && ({}))", containers("containers"), containers("initContainers")), "message": message},
                ],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"gpu.deckhouse.io/class": gpu_class}},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": namespaces},
                ]}},
            },
        });
        let params = PatchParams::apply(self.writer.field_manager());
        policies
            .patch(&name, &params, &Patch::Apply(&policy))
            .await
            .map_err(EdgeError::api(format!(
                "apply ValidatingAdmissionPolicy {name}"
            )))?;
        bindings
            .patch(&name, &params, &Patch::Apply(&binding))
            .await
            .map_err(EdgeError::api(format!(
                "apply ValidatingAdmissionPolicyBinding {name}"
            )))?;
        Ok(())
    }

    /// A deleted class's DeviceClasses and namespace restriction go.
    async fn retire_device_classes(
        &self,
        gpu_class: &str,
        device_classes: &[String],
    ) -> Result<Outcome, EdgeError> {
        let classes: Api<DeviceClass> = Api::all(self.writer.client());
        for name in device_classes {
            match classes.delete(name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(EdgeError::api(format!("delete DeviceClass {name}"))(err)),
            }
        }
        self.restrict_namespaces(gpu_class, &[], &[]).await?;
        Ok(Outcome::default())
    }

    /// The GPU class's DeviceClasses (Server-Side Apply, owned by this
    /// service) and its status.
    async fn publish_device_classes(
        &self,
        gpu_class: &str,
        variants: &[switchyard_proto::v1::CompiledVariant],
        refused: Option<&str>,
    ) -> Result<Outcome, EdgeError> {
        let classes: Api<DeviceClass> = Api::all(self.writer.client());
        let params = PatchParams::apply(self.writer.field_manager());
        let gpu_classes: Api<GPUClass> = Api::all(self.writer.client());
        let current = gpu_classes
            .get(gpu_class)
            .await
            .map_err(EdgeError::api(format!("read GPUClass {gpu_class}")))?;
        // A refused spec changes no DeviceClass: only the condition says why.
        for v in variants.iter().filter(|_| refused.is_none()) {
            let object = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": v.device_class, "labels": {"gpu.deckhouse.io/class": gpu_class}},
                "spec": {
                    "selectors": [{"cel": {"expression": v.cel_selector}}],
                    "extendedResourceName": v.extended_resource_name,
                },
            });
            classes
                .patch(&v.device_class, &params, &Patch::Apply(&object))
                .await
                .map_err(EdgeError::api(format!(
                    "apply DeviceClass {}",
                    v.device_class
                )))?;
        }
        let (ready, reason, message) = match refused {
            Some(why) => ("False", "InvalidSpec", why.to_string()),
            None => (
                "True",
                "Compiled",
                format!("compiled into {} DeviceClasses", variants.len()),
            ),
        };
        // The transition time moves only when the condition's status does.
        let since = current
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == ready)
            .map(|c| serde_json::to_value(&c.last_transition_time).unwrap_or_default())
            .unwrap_or_else(|| {
                json!(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())
            });
        let status = json!({
            "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": gpu_class},
            "status": {
                "deviceClassNames": variants.iter().map(|v| v.device_class.clone()).collect::<Vec<_>>(),
                "variants": variants.iter().map(|v| json!({
                    "name": v.variant,
                    "deviceClass": v.device_class,
                    "extendedResourceName": v.extended_resource_name,
                })).collect::<Vec<_>>(),
                "conditions": [{
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": since,
                    "observedGeneration": current.metadata.generation.unwrap_or(0),
                }],
            },
        });
        gpu_classes
            .patch_status(gpu_class, &params, &Patch::Apply(&status))
            .await
            .map_err(EdgeError::api(format!(
                "apply the status of GPUClass {gpu_class}"
            )))?;
        Ok(Outcome::default())
    }
}
