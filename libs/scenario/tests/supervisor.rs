//! A core that fails does not bring the system down: under the actors'
//! supervisor, a stack-assigner that panics in the middle of the reference
//! migration is restarted from the log, decides what was due, and the
//! migration completes with every invariant but one holding — the one that
//! reports the failure.

use switchyard_core::effects::Effect;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_proto::v1::DomainEvent;
use switchyard_runtime::{Actors, Core, CoreState, Input, ServiceName};
use switchyard_scenario::run_reference;
use switchyard_sim::SimConfig;

/// A stack-assigner that panics on the record after `records_left` more.
struct Failing {
    core: StackAssigner,
    records_left: u32,
}

impl Core for Failing {
    fn service(&self) -> ServiceName {
        ServiceName::StackAssigner
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.core.apply(event, at);
    }
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        if let Input::Record(_) = input {
            if self.records_left == 0 {
                panic!("a planted failure");
            }
            self.records_left -= 1;
        }
        Core::decide(&mut self.core, input, now)
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        Core::catch_up(&mut self.core, now)
    }
    fn effects(&self) -> Vec<Effect> {
        Core::effects(&self.core)
    }
    fn violations(&self) -> Vec<(&'static str, String)> {
        Core::violations(&self.core)
    }
    fn snapshot(&self) -> CoreState {
        Core::snapshot(&self.core)
    }
}

#[tokio::test]
async fn a_failed_core_is_restarted_from_the_log_and_the_migration_completes() {
    for records_left in [0, 25, 120] {
        let cores = switchyard_core::cores::all()
            .into_iter()
            .map(|core| -> Box<dyn Core> {
                if core.service() == ServiceName::StackAssigner {
                    Box::new(Failing {
                        core: StackAssigner::default(),
                        records_left,
                    })
                } else {
                    core
                }
            })
            .collect();
        let services = Actors::spawn_cores(cores).await.expect("actors");
        let outcome = run_reference(SimConfig::default(), services, (), |_| {}).await;
        for step in &outcome.steps {
            assert!(step.ok, "after {records_left} records: {step:?}");
        }
        for check in &outcome.checks {
            if check.name == "service" {
                assert!(!check.ok, "the failure is reported");
                assert_eq!(
                    check.detail,
                    "stack-assigner failed on a record and was restarted from the log",
                    "after {records_left} records"
                );
            } else {
                assert!(check.ok, "after {records_left} records: {check:?}");
            }
        }
        outcome.migration.services.stop().await;
    }
}
