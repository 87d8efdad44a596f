//! `switchyard evidence`: the exit evidence of the NVIDIA guide's stage
//! table, checked by the running claim-allocator on the facts as they are now
//! and recorded in the log per node and workload (a ticket's or an audit's
//! record with `-o json`). Exit 0: every node and workload shows its
//! evidence; 1: some do not (or the check was refused).

use std::process::ExitCode;

use clap::Args;
use switchyard_core::ServiceName;
use switchyard_core::claim_allocator::Stage;
use switchyard_proto::v1::{CheckEvidenceCommand, domain_event::Kind, service_command};

use crate::operator::OperatorArgs;

#[derive(Args, Debug)]
pub struct EvidenceArgs {
    /// The migration whose waves to check; default: every GPU node and every
    /// verified move.
    #[arg(long = "migration", env = "SWITCHYARD_MIGRATION")]
    pub migration: Option<String>,
    /// One wave (1-based) of the migration; default: every wave started.
    #[arg(long, requires = "migration", value_parser = clap::value_parser!(u32).range(1..))]
    pub wave: Option<u32>,
    /// One stage of the NVIDIA guide's table ("Migrate Workloads in
    /// Stages"), its exit evidence on the cluster as it is: baseline (node
    /// capacity, where nvidia.com/gpu workloads run), pilot-pool (no dual
    /// advertisement, DRA plug-in healthy), driver-validation (the slices
    /// against the cards), native-claim-pilot (bound claim, correct node),
    /// compatibility-bridge (an unchanged nvidia.com/gpu manifest on both
    /// pools, DRA's implicit claim on the DRA one), application-wave (the
    /// verified moves), final-cutover (no device-plugin pods or resources,
    /// no legacy workload).
    #[arg(long, conflicts_with = "migration", value_parser = Stage::ALL.map(Stage::name))]
    pub stage: Option<String>,
    /// The check's id in the log; default: evidence-<random>.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

pub async fn evidence(args: EvidenceArgs) -> anyhow::Result<ExitCode> {
    let check_id = args.id.unwrap_or_else(|| {
        format!(
            "evidence-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )
    });
    let command = service_command::Command::CheckEvidence(CheckEvidenceCommand {
        check_id,
        migration_id: args.migration.unwrap_or_default(),
        wave: args.wave.map(|w| w - 1),
        stage: args.stage.unwrap_or_default(),
    });
    let reply = args
        .operator
        .send(ServiceName::ClaimAllocator, command)
        .await?;
    if args.operator.report(&reply)? {
        return Ok(ExitCode::from(1));
    }
    // Checked before under this id: its result as recorded then, not a
    // new check.
    let decisions = match reply.resumed_from_sequence {
        0 => reply.decisions,
        from => {
            let recorded = args
                .operator
                .recorded(&reply.resumed_process, from, |d| {
                    matches!(d.kind, Some(Kind::EvidenceChecked(_)))
                })
                .await?;
            for event in &recorded {
                args.operator.print(event)?;
            }
            recorded
        }
    };
    let failed: u32 = decisions
        .iter()
        .map(|d| match &d.kind {
            Some(Kind::EvidenceChecked(c)) => c.failed,
            _ => 0,
        })
        .sum();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
