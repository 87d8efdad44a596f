//! The Helm chart (`deploy/helm/switchyard`) on a real API server: every object
//! it renders passes the server's validation (server-side apply, dry run), its
//! schema refuses typos, and each service's ServiceAccount can do what the
//! service needs and is refused the rest — by RBAC, and for the node agent by
//! the chart's admission policy that keeps it to its own node; DRA admin
//! access only in the namespaces the chart's other policy allows.
//! Its alert rules pass promtool's checks and tests; its PodMonitor scrapes
//! every pod that serves metrics; its Grafana dashboards' queries are PromQL
//! that promtool accepts, over series the services expose.
//!
//! helm comes from `scripts/install-helm.sh`, the control plane from
//! `scripts/control-plane.sh`; a missing one fails the test saying so.

mod admin_access;
mod alerts;
mod backend;
mod dashboards;
mod least_privilege;
mod monitoring;
mod rbac;
mod render;
mod support;
