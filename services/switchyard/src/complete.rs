//! `switchyard complete`: the reference's completion — quotas translated with
//! the same values, leftover device-plugin labels cleared, and once the trial
//! period is over the source group's `spec.gpu` removed — as a command to the
//! running claim-allocator. On the nvidia-operator backend, from the legacy
//! pool: the quotas, then the final cutover (the device plugin may go
//! chart-wide); from a DRA pool: an abandoned migration, checked clear
//! before the DRA driver is uninstalled.

use std::process::ExitCode;

use clap::Args;
use switchyard_core::ServiceName;
use switchyard_proto::v1::{CompleteCommand, service_command};

use crate::operator::OperatorArgs;

#[derive(Args, Debug)]
pub struct CompleteArgs {
    /// The source group: the device plugin's, e.g. gpu.
    #[arg(long)]
    pub from: String,
    /// The GPU class whose devices the quotas are translated to (not needed
    /// to complete an abandoned migration: `--from` a DRA pool of the
    /// nvidia-operator backend, every node of it rolled back).
    #[arg(long, default_value = "")]
    pub class: String,
    /// The trial period on DRA is over: remove the source group's spec.gpu
    /// (rollbacks need device-plugin nodes, so this comes last).
    #[arg(long)]
    pub trial_over: bool,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

pub async fn complete(args: CompleteArgs) -> anyhow::Result<ExitCode> {
    let command = service_command::Command::Complete(CompleteCommand {
        source_group: args.from,
        gpu_class: args.class,
        trial_period_over: args.trial_over,
    });
    args.operator
        .run(ServiceName::ClaimAllocator, command)
        .await
}
