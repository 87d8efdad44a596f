//! Services rebuilt from the log decide what the log shows due and nothing
//! else: one that starts after the facts were recorded reaches the state it
//! would have reached running all along; one restarted on a complete log
//! decides nothing; one that stopped before recording its decisions decides
//! only what it was about to.

use switchyard_core::effects::Effect;
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};
use switchyard_runtime::{Core, Input, Local, Record, ServiceName, Services};
use switchyard_scenario::{Logged, Migration, States, run_reference};
use switchyard_sim::SimConfig;

const DISPATCH_ORDER: [ServiceName; 4] = ServiceName::DISPATCH_ORDER;

fn core(name: ServiceName) -> Box<dyn Core> {
    name.core()
}

fn is_fact(record: &Logged) -> bool {
    record.actor == ServiceName::Inventory || record.actor == ServiceName::NodeAgent
}

/// The first decision of an operator's command, or any of completion's
/// (commanded only): the command is not in the log, so nothing rebuilt from
/// the log can decide these.
fn commanded(record: &Logged) -> bool {
    matches!(
        record.event.kind,
        Some(
            Kind::HandoverStarted(_)
                | Kind::HandoverRefused(_)
                | Kind::ApplicationMoveStarted(_)
                | Kind::ApplicationMoveRefused(_)
                | Kind::RollbackStarted(_)
                | Kind::CompletionRefused(_)
                | Kind::ResourceQuotaTranslated(_)
                | Kind::LeftoverLabelsCleared(_)
                | Kind::SourceGroupRetired(_)
        )
    )
}

fn describe(events: &[DomainEvent]) -> Vec<String> {
    events.iter().map(|e| format!("{e:?}")).collect()
}

/// Steps 1 and 2 of the reference (the target group, DRA on, a GPU class) on
/// a cluster upgraded with DRA on: its log, and the states the services
/// reached running all along and the effects they want.
async fn set_up() -> (Vec<Logged>, States, Vec<Effect>) {
    let mut m = Migration::new(SimConfig::default(), Local::default(), ()).await;
    m.sim.set_group("gpu-dra", None);
    m.pump().await;
    m.sim.create_gpu_class("a100");
    m.pump().await;
    let states = m.states().await;
    let effects = m.services.effects().await;
    (m.log.clone(), states, effects)
}

/// Every deciding service starts after inventory and node-agent recorded the
/// cluster (the upgrade, the held group, the class): each, started in turn,
/// rebuilds from the log and records what is due; the services already
/// running hear those records live. They end where services running all
/// along ended, holds and alerts included.
#[tokio::test]
async fn services_started_after_the_facts_were_recorded_catch_up() {
    let (live, live_states, live_effects) = set_up().await;
    let now = live.last().expect("records").at;
    let mut log: Vec<(ServiceName, DomainEvent)> = live
        .iter()
        .filter(|r| is_fact(r))
        .map(|r| (r.actor, r.event.clone()))
        .collect();
    let mut started: Vec<Box<dyn Core>> = Vec::new();
    for name in DISPATCH_ORDER {
        let mut late = core(name);
        for (_, event) in &log {
            late.fold(event, now);
        }
        let mut queue: Vec<Record> = late
            .catch_up(now)
            .into_iter()
            .map(|event| Record { actor: name, event })
            .collect();
        started.push(late);
        while !queue.is_empty() {
            let record = queue.remove(0);
            for service in started.iter_mut().filter(|s| s.service() != record.actor) {
                let actor = service.service();
                queue.extend(
                    service
                        .decide(Input::Record(&record.event), now)
                        .into_iter()
                        .map(|event| Record { actor, event }),
                );
            }
            log.push((record.actor, record.event));
        }
    }
    let late_states = States::replay(log.iter().map(|(_, e)| (e, now)));
    assert!(
        !live_states.stack.held().is_empty() && !live_states.alerter.firing().is_empty(),
        "the set-up holds a group and fires its alert"
    );
    assert!(
        !live_states.compiler.compiled().is_empty(),
        "a class compiled"
    );
    assert_eq!(late_states.stack.held(), live_states.stack.held());
    assert_eq!(
        late_states.stack.assignments(),
        live_states.stack.assignments()
    );
    assert_eq!(late_states.alerter, live_states.alerter);
    assert_eq!(late_states.compiler, live_states.compiler);
    assert_eq!(late_states.claims, live_states.claims);
    let late_effects: Vec<Effect> = started.iter().flat_map(|s| s.effects()).collect();
    assert_eq!(late_effects, live_effects);
}

/// Every cut of the reference migration's log, for every deciding service:
/// rebuilt from the records before the cut, a service decides nothing where
/// the cut falls between two rounds — before a fact, a command or a later
/// time: all decided so far was recorded — and elsewhere — a stop before its
/// decisions were all recorded — it decides, then and as the other services'
/// records of the round reach it, exactly what it decided live in the rest
/// of the round. (A service appends its consecutive decisions about one
/// subject atomically, so no stop falls between those.)
#[tokio::test]
async fn a_restart_at_any_record_decides_what_was_due_and_nothing_else() {
    for (seed, upgraded_with_dra) in [(1, true), (2, true), (3, false)] {
        let config = SimConfig {
            seed,
            upgraded_with_dra,
            ..SimConfig::default()
        };
        let outcome = run_reference(config, Local::default(), (), |_| {}).await;
        assert!(outcome.ok());
        restarts_at_every_record(&outcome.migration.log);
    }
}

fn restarts_at_every_record(log: &[Logged]) {
    let (mut complete, mut partial) = (0, 0);
    for name in DISPATCH_ORDER {
        for k in 1..log.len() {
            if log[k].actor == log[k - 1].actor && log[k].subject() == log[k - 1].subject() {
                continue;
            }
            let mut rebuilt = core(name);
            for record in &log[..k] {
                rebuilt.fold(&record.event, record.at);
            }
            let now = log[k - 1].at;
            let round_goes_on = |r: &Logged| !is_fact(r) && !commanded(r) && r.at == now;
            let due = rebuilt.catch_up(now);
            if !round_goes_on(&log[k]) {
                complete += 1;
                assert!(
                    due.is_empty(),
                    "{name} rebuilt from the {k} records before {:?} decides {:?}",
                    log[k].event,
                    describe(&due)
                );
                continue;
            }
            let end = log[k..]
                .iter()
                .position(|r| !round_goes_on(r))
                .map_or(log.len(), |i| k + i);
            let stretch = &log[k..end];
            let mut decided: Vec<DomainEvent> = due;
            for record in stretch.iter().filter(|r| r.actor != name) {
                let delivered = Record {
                    actor: record.actor,
                    event: record.event.clone(),
                };
                decided.extend(rebuilt.decide(Input::Record(&delivered.event), record.at));
            }
            let live: Vec<DomainEvent> = stretch
                .iter()
                .filter(|r| r.actor == name)
                .map(|r| r.event.clone())
                .collect();
            partial += usize::from(!live.is_empty());
            assert_eq!(
                sorted(&decided),
                sorted(&live),
                "{name} rebuilt from the {k} records before {:?}",
                log[k].event
            );
        }
    }
    assert!(complete > 1000 && partial > 40, "{complete} {partial}");
}

fn sorted(events: &[DomainEvent]) -> Vec<String> {
    let mut described = describe(events);
    described.sort();
    described
}
